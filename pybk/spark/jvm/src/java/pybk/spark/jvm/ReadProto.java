package pybk.spark.jvm;

import io.netty.buffer.ByteBuf;
import java.io.ByteArrayOutputStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;

/**
 * The protobuf encoding of the two messages of a bookie's Read call (pybk/proto/bookie.proto), by
 * hand: protobuf-java is not on Spark's classpath. Decoding checks every length against what is left,
 * so a malformed answer is a BookieReadException naming the fault, never an index error.
 */
final class ReadProto {
  /** ReadFlag PACKED | DIGESTS_CHECKED: bodies back to back, the reader checks the digests. */
  static final int PACKED_DIGESTS_CHECKED = 4 | 8;

  private ReadProto() {
  }

  /** A ReadResults as read: its status and, for PACKED answers, its entries. */
  static final class Results {
    int status;
    String message = "";
    long missingEntry;
    long firstBodyEntry;
    byte[] bodies = new byte[0];
    int[] sizes = new int[0];
  }

  /** The ReadRequest of entries first..last of a ledger, packed, every entry (step 1). */
  static byte[] readRequest(long ledgerId, long first, long last) {
    ByteArrayOutputStream out = new ByteArrayOutputStream(48);
    field(out, 1, ledgerId);
    field(out, 2, first);
    field(out, 3, last);
    field(out, 4, PACKED_DIGESTS_CHECKED);
    field(out, 8, 1);
    return out.toByteArray();
  }

  private static void field(ByteArrayOutputStream out, int number, long value) {
    if (value != 0) {
      varint(out, (long) number << 3);
      varint(out, value);
    }
  }

  private static void varint(ByteArrayOutputStream out, long v) {
    while ((v & ~0x7FL) != 0) {
      out.write((int) ((v & 0x7F) | 0x80));
      v >>>= 7;
    }
    out.write((int) v);
  }

  /** The ReadResults in {@code buf} (all its readable bytes, which are consumed). */
  static Results readResults(ByteBuf buf, String address) throws BookieReadException {
    Results r = new Results();
    Sizes sizes = new Sizes();
    List<long[]> entryIds = null;
    List<byte[]> entryBodies = null;
    boolean sawBodies = false;
    while (buf.isReadable()) {
      long tag = varint(buf, address);
      int number = (int) (tag >>> 3);
      int type = (int) (tag & 7);
      switch (number) {
        case 1: r.status = (int) varintField(buf, type, number, address); break;
        case 2: r.message = new String(bytes(buf, type, number, address), StandardCharsets.UTF_8); break;
        case 3: {
          int len = length(buf, type, number, address);
          if (entryIds == null) {
            entryIds = new ArrayList<>();
            entryBodies = new ArrayList<>();
          }
          ByteBuf entry = buf.readSlice(len);
          long[] id = new long[1];
          byte[] body = new byte[0];
          while (entry.isReadable()) {
            long t = varint(entry, address);
            if ((t >>> 3) == 1) {
              id[0] = varintField(entry, (int) (t & 7), 1, address);
            } else if ((t >>> 3) == 2) {
              body = bytes(entry, (int) (t & 7), 2, address);
            } else {
              skip(entry, (int) (t & 7), (int) (t >>> 3), address);
            }
          }
          entryIds.add(id);
          entryBodies.add(body);
          break;
        }
        case 5: r.missingEntry = varintField(buf, type, number, address); break;
        case 6: r.firstBodyEntry = varintField(buf, type, number, address); break;
        case 7: r.bodies = bytes(buf, type, number, address); sawBodies = true; break;
        case 8:
          if (type == 2) {
            ByteBuf packed = buf.readSlice(length(buf, type, number, address));
            while (packed.isReadable()) {
              sizes.add(size(varint(packed, address), address));
            }
          } else {
            sizes.add(size(varintField(buf, type, number, address), address));
          }
          break;
        default: skip(buf, type, number, address);
      }
    }
    r.sizes = sizes.toArray();
    long total = 0;
    for (int s : r.sizes) {
      total += s;
    }
    if (total != r.bodies.length) {
      throw malformed(address, "body sizes adding up to " + total + " bytes for " + r.bodies.length
          + " bytes of bodies");
    }
    if (r.sizes.length == 0 && entryIds != null && !sawBodies) {
      packEntries(r, entryIds, entryBodies, address);
    }
    return r;
  }

  /** A bookie from before PACKED answers with a ReadEntry per entry: the same entries, packed. */
  private static void packEntries(Results r, List<long[]> ids, List<byte[]> bodies, String address)
      throws BookieReadException {
    long total = 0;
    r.sizes = new int[bodies.size()];
    for (int i = 0; i < r.sizes.length; i++) {
      if (ids.get(i)[0] != ids.get(0)[0] + i) {
        throw malformed(address, "entries " + ids.get(0)[0] + ", ... " + ids.get(i)[0] + " do not follow each other");
      }
      r.sizes[i] = bodies.get(i).length;
      total += r.sizes[i];
    }
    r.firstBodyEntry = ids.get(0)[0];
    r.bodies = new byte[(int) total];
    int pos = 0;
    for (byte[] b : bodies) {
      System.arraycopy(b, 0, r.bodies, pos, b.length);
      pos += b.length;
    }
  }

  private static long varint(ByteBuf buf, String address) throws BookieReadException {
    long v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (!buf.isReadable()) {
        throw malformed(address, "a truncated varint");
      }
      byte b = buf.readByte();
      v |= (long) (b & 0x7F) << shift;
      if (b >= 0) {
        return v;
      }
    }
    throw malformed(address, "a varint of more than 10 bytes");
  }

  private static long varintField(ByteBuf buf, int type, int number, String address) throws BookieReadException {
    if (type != 0) {
      throw malformed(address, "field " + number + " of wire type " + type + ", not a varint");
    }
    return varint(buf, address);
  }

  private static int length(ByteBuf buf, int type, int number, String address) throws BookieReadException {
    if (type != 2) {
      throw malformed(address, "field " + number + " of wire type " + type + ", not length-delimited");
    }
    long len = varint(buf, address);
    if (len < 0 || len > buf.readableBytes()) {
      throw malformed(address, "field " + number + " of " + len + " bytes where " + buf.readableBytes() + " are left");
    }
    return (int) len;
  }

  private static byte[] bytes(ByteBuf buf, int type, int number, String address) throws BookieReadException {
    byte[] b = new byte[length(buf, type, number, address)];
    buf.readBytes(b);
    return b;
  }

  private static int size(long v, String address) throws BookieReadException {
    if (v < 0 || v > Integer.MAX_VALUE) {
      throw malformed(address, "a body size of " + v);
    }
    return (int) v;
  }

  private static void skip(ByteBuf buf, int type, int number, String address) throws BookieReadException {
    int n;
    switch (type) {
      case 0: varint(buf, address); return;
      case 1: n = 8; break;
      case 2: n = length(buf, type, number, address); break;
      case 5: n = 4; break;
      default: throw malformed(address, "field " + number + " of unknown wire type " + type);
    }
    if (n > buf.readableBytes()) {
      throw malformed(address, "field " + number + " of " + n + " bytes where " + buf.readableBytes() + " are left");
    }
    buf.skipBytes(n);
  }

  private static BookieReadException malformed(String address, String what) {
    return new BookieReadException(address, BookieReadException.TRANSPORT, "malformed ReadResults: " + what);
  }

  /** A growing int array (body sizes without an object each). */
  private static final class Sizes {
    private int[] a = new int[64];
    private int n;

    void add(int v) {
      if (n == a.length) {
        a = java.util.Arrays.copyOf(a, n * 2);
      }
      a[n++] = v;
    }

    int[] toArray() {
      return java.util.Arrays.copyOf(a, n);
    }
  }
}
