package pybk.spark.jvm;

/** How an entry's integrity is checked (pybk/entry.py): its size in the body after the header. */
enum Digest {
  CRC32C(4),
  MAC(32);

  final int size;

  Digest(int size) {
    this.size = size;
  }
}
