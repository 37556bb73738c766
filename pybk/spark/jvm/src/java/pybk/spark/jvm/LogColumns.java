package pybk.spark.jvm;

import org.apache.spark.sql.execution.vectorized.ConstantColumnVector;
import org.apache.spark.sql.execution.vectorized.OnHeapColumnVector;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * The column vectors of one batch of a log scan, in the order of the schema Spark asked for
 * (the log columns of pybk/spark/logscan.py: log, offset, timestamp, key, payload, producer_id,
 * sequence; a schema given to the read may name some of them): reused from batch to batch, as
 * Spark's own columnar readers do. `log` is one constant per partition.
 */
final class LogColumns implements AutoCloseable {
  private final ColumnVector[] vectors;
  private final ColumnarBatch batch;
  private OnHeapColumnVector offset;
  private OnHeapColumnVector timestamp;
  private OnHeapColumnVector key;
  private OnHeapColumnVector payload;
  private OnHeapColumnVector producer;
  private OnHeapColumnVector sequence;
  private int rows;

  LogColumns(StructType schema, String log, int capacity) {
    StructField[] fields = schema.fields();
    vectors = new ColumnVector[fields.length];
    for (int i = 0; i < fields.length; i++) {
      String name = fields[i].name();
      switch (name) {
        case "log": {
          ConstantColumnVector c = new ConstantColumnVector(capacity, DataTypes.StringType);
          c.setUtf8String(UTF8String.fromString(log));
          vectors[i] = c;
          break;
        }
        case "offset":
          vectors[i] = offset = new OnHeapColumnVector(capacity, DataTypes.LongType);
          break;
        case "timestamp":
          vectors[i] = timestamp = new OnHeapColumnVector(capacity, DataTypes.TimestampType);
          break;
        case "key":
          vectors[i] = key = new OnHeapColumnVector(capacity, DataTypes.BinaryType);
          break;
        case "payload":
          vectors[i] = payload = new OnHeapColumnVector(capacity, DataTypes.BinaryType);
          break;
        case "producer_id":
          vectors[i] = producer = new OnHeapColumnVector(capacity, DataTypes.LongType);
          break;
        case "sequence":
          vectors[i] = sequence = new OnHeapColumnVector(capacity, DataTypes.LongType);
          break;
        default:
          throw new PybkScanException("schema: " + name + " is not a column of a log scan");
      }
    }
    batch = new ColumnarBatch(vectors);
  }

  int rows() {
    return rows;
  }

  /** Empty the vectors for the next batch. */
  void reset() {
    rows = 0;
    for (ColumnVector v : vectors) {
      if (v instanceof OnHeapColumnVector) {
        ((OnHeapColumnVector) v).reset();
      }
    }
  }

  /** One record: key buf[key, key + klen) (klen -1: none), payload buf[payload, payload + plen). */
  void append(long off, long tsMillis, byte[] buf, int keyAt, int klen, int payloadAt, int plen, long producerId,
      long seq) {
    int r = rows++;
    if (offset != null) {
      offset.putLong(r, off);
    }
    if (timestamp != null) {
      timestamp.putLong(r, tsMillis * 1000);
    }
    if (key != null) {
      if (klen < 0) {
        key.putNull(r);
      } else {
        key.putByteArray(r, buf, keyAt, klen);
      }
    }
    if (payload != null) {
      payload.putByteArray(r, buf, payloadAt, plen);
    }
    if (producer != null) {
      if (producerId == 0) {
        producer.putNull(r);
      } else {
        producer.putLong(r, producerId);
      }
    }
    if (sequence != null) {
      if (seq == -1) {
        sequence.putNull(r);
      } else {
        sequence.putLong(r, seq);
      }
    }
  }

  /** The batch of the records appended since the last reset. */
  ColumnarBatch batch() {
    batch.setNumRows(rows);
    return batch;
  }

  @Override
  public void close() {
    batch.close();
  }
}
