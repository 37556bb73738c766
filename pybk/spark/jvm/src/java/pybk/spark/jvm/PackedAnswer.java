package pybk.spark.jvm;

/** One answer of a packed range read: entries firstEntry, firstEntry + 1, ... whose bodies lie back to
 * back in {@code bodies} from offset 0, entry i's taking {@code sizes[i]} bytes. */
public final class PackedAnswer {
  public final long firstEntry;
  public final byte[] bodies;
  public final int[] sizes;

  public PackedAnswer(long firstEntry, byte[] bodies, int[] sizes) {
    this.firstEntry = firstEntry;
    this.bodies = bodies;
    this.sizes = sizes;
  }

  /** The number of entries. */
  public int count() {
    return sizes.length;
  }
}
