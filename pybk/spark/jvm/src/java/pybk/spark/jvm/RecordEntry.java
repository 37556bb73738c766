package pybk.spark.jvm;

import java.nio.ByteBuffer;

/**
 * The records of one log entry's payload (pybk/log/codec.py), read into LogColumns a batch at
 * a time: a 40-byte header (magic "PL", version, flags, count u32, first index u64, max
 * timestamp ms, producer id u64 (0: none), first sequence (-1: none)), then a header per record
 * (version 1: timestamp i64, key length i32 (-1: no key), payload length u32; version 2: the
 * payload length u32 of a keyless record stamped with the max timestamp), then the records' keys
 * and payloads back to back. Everything a header claims is checked against the entry's size
 * before any record is read.
 */
final class RecordEntry {
  static final int HEADER_SIZE = 40;
  private static final int FULL = 16;
  private static final int UNIFORM = 4;

  private ByteBuffer bb;
  private byte[] buf;
  private long count;
  private long firstIndex;
  private long maxTs;
  private long producer;
  private long firstSeq;
  private int recordHeader;
  private int nextHeader;
  private int nextData;
  private long index;   // of the next record within the entry

  /** Open the entry buf[off, off + len) (bb wraps buf); CorruptEntryException if it is not a well-formed record entry. */
  void open(ByteBuffer bb, byte[] buf, int off, int len) throws CorruptEntryException {
    if (len < HEADER_SIZE) {
      throw new CorruptEntryException("entry of " + len + " bytes is shorter than a record entry header ("
          + HEADER_SIZE + " bytes)");
    }
    int version = buf[off + 2] & 0xff;
    if (buf[off] != 'P' || buf[off + 1] != 'L' || (version != 1 && version != 2)) {
      throw new CorruptEntryException("entry does not start with a record entry header (magic, then version 1 or 2; "
          + "got version " + version + ")");
    }
    count = Integer.toUnsignedLong(bb.getInt(off + 4));
    if (count == 0) {
      throw new CorruptEntryException("record entry holds no records");
    }
    firstIndex = bb.getLong(off + 8);
    maxTs = bb.getLong(off + 16);
    producer = bb.getLong(off + 24);
    firstSeq = bb.getLong(off + 32);
    recordHeader = version == 2 ? UNIFORM : FULL;
    long dataStart = (long) off + HEADER_SIZE + count * recordHeader;
    long end = (long) off + len;
    if (dataStart > end) {
      throw new CorruptEntryException("record entry claims " + count + " records, whose headers do not fit in its "
          + len + " bytes");
    }
    long total = 0;
    for (long h = off + HEADER_SIZE; h < dataStart; h += recordHeader) {
      int at = (int) h;
      if (recordHeader == FULL) {
        int klen = bb.getInt(at + 8);
        if (klen < -1) {
          throw new CorruptEntryException("record entry has a negative key length other than -1 (no key)");
        }
        total += Math.max(klen, 0) + Integer.toUnsignedLong(bb.getInt(at + 12));
      } else {
        total += Integer.toUnsignedLong(bb.getInt(at));
      }
    }
    if (total != end - dataStart) {
      throw new CorruptEntryException("record entry's records claim " + total + " bytes of keys and payloads but "
          + (end - dataStart) + " follow their headers");
    }
    this.bb = bb;
    this.buf = buf;
    nextHeader = off + HEADER_SIZE;
    nextData = (int) dataStart;
    index = 0;
  }

  /** The segment index of the entry's first record and the index after its last. */
  long firstIndex() {
    return firstIndex;
  }

  boolean done() {
    return index >= count;
  }

  /**
   * Append up to `room` records with offsets in [lo, hi) (a record's offset: segFirst plus its
   * index in the segment) to cols; returns how many. Records below lo are skipped; the entry is
   * done at the first at or above hi.
   */
  int fill(LogColumns cols, int room, long segFirst, long lo, long hi) {
    int added = 0;
    while (index < count && added < room) {
      long offset = segFirst + firstIndex + index;
      if (offset >= hi) {
        index = count;
        break;
      }
      long ts;
      int klen;
      int plen;
      if (recordHeader == FULL) {
        ts = bb.getLong(nextHeader);
        klen = bb.getInt(nextHeader + 8);
        plen = bb.getInt(nextHeader + 12);
      } else {
        ts = maxTs;
        klen = -1;
        plen = bb.getInt(nextHeader);
      }
      int key = nextData;
      int payload = key + Math.max(klen, 0);
      if (offset >= lo) {
        long seq = firstSeq == -1 ? -1 : firstSeq + index;
        cols.append(offset, ts, buf, key, klen, payload, plen, producer, seq);
        added++;
      }
      nextHeader += recordHeader;
      nextData = payload + plen;
      index++;
    }
    return added;
  }
}
