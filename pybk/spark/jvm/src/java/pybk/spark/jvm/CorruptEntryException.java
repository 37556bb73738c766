package pybk.spark.jvm;

/** An entry that fails its digest or is not a well-formed record entry: its message says how. */
final class CorruptEntryException extends Exception {
  CorruptEntryException(String message) {
    super(message);
  }
}
