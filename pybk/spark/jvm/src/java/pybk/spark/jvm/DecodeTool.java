package pybk.spark.jvm;

import java.io.DataInputStream;
import java.io.EOFException;
import java.io.PrintStream;
import java.nio.ByteBuffer;
import java.util.HexFormat;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;

/**
 * Test driver of the reader's decoding (tests/spark/test_jvm_decoder.py holds it to the Python
 * codec's results): entry bodies on stdin, each as u64 entry id, u32 size, body; per body, its
 * records with offsets in [lo, hi) as "record OFFSET TIMESTAMP_US KEY PAYLOAD PRODUCER SEQUENCE"
 * (hex, "-" for null), or "error MESSAGE" when its digest or its records are refused; then "end".
 * Usage: DecodeTool LEDGER_ID CRC32C|MAC PASSWORD_HEX SEG_FIRST LO HI
 */
public final class DecodeTool {
  private DecodeTool() {}

  public static void main(String[] args) throws Exception {
    long ledgerId = Long.parseLong(args[0]);
    Digest digest = Digest.valueOf(args[1]);
    byte[] password = HexFormat.of().parseHex(args[2]);
    long segFirst = Long.parseLong(args[3]);
    long lo = Long.parseLong(args[4]);
    long hi = Long.parseLong(args[5]);
    EntryVerifier verifier = new EntryVerifier(ledgerId, digest, password);
    // built field by field: parsing DDL would load Spark's SQL parser, seconds of a small JVM's start
    StructType schema = new StructType()
        .add("log", DataTypes.StringType, false).add("offset", DataTypes.LongType, false)
        .add("timestamp", DataTypes.TimestampType, false).add("key", DataTypes.BinaryType)
        .add("payload", DataTypes.BinaryType, false).add("producer_id", DataTypes.LongType)
        .add("sequence", DataTypes.LongType);
    RecordEntry entry = new RecordEntry();
    PrintStream out = new PrintStream(System.out, false, "UTF-8");
    HexFormat hex = HexFormat.of();
    DataInputStream in = new DataInputStream(System.in);
    try (LogColumns cols = new LogColumns(schema, "t", LogPartitionReader.BATCH_ROWS)) {
      while (true) {
        long entryId;
        try {
          entryId = in.readLong();
        } catch (EOFException e) {
          break;
        }
        byte[] body = new byte[in.readInt()];
        in.readFully(body);
        try {
          int start = verifier.payloadStart(body, 0, body.length, entryId);
          entry.open(ByteBuffer.wrap(body), body, start, body.length - start);
          while (!entry.done()) {
            cols.reset();
            entry.fill(cols, LogPartitionReader.BATCH_ROWS, segFirst, lo, hi);
            var b = cols.batch();
            for (int r = 0; r < b.numRows(); r++) {
              var v = b.getRow(r);
              out.println("record " + v.getLong(1) + " " + v.getLong(2) + " "
                  + (v.isNullAt(3) ? "-" : hex.formatHex(v.getBinary(3))) + " " + hex.formatHex(v.getBinary(4)) + " "
                  + (v.isNullAt(5) ? "-" : v.getLong(5)) + " " + (v.isNullAt(6) ? "-" : v.getLong(6)));
            }
          }
        } catch (CorruptEntryException e) {
          out.println("error " + e.getMessage());
        }
      }
    }
    out.println("end");
    out.flush();
  }
}
