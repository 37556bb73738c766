package pybk.spark.jvm;

import java.io.IOException;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnarBatch;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * One partition of a log scan as column batches: the partition's entries (EntryStream, digests
 * checked per entry), their records kept when lo <= offset < hi, BATCH_ROWS records a batch.
 */
final class LogPartitionReader implements PartitionReader<ColumnarBatch> {
  static final int BATCH_ROWS = 4096;
  private static final Logger LOG = LoggerFactory.getLogger("pybk.spark");   // Spark's logging (log4j)

  private final LogInputPartition p;
  private final EntryStream entries;
  private final RecordEntry entry = new RecordEntry();
  private final LogColumns columns;
  private boolean inEntry;
  private boolean finished;

  LogPartitionReader(LogInputPartition p, StructType schema) {
    this.p = p;
    this.entries = new EntryStream(p, BookieConnections.shared());
    this.columns = new LogColumns(schema, p.log, BATCH_ROWS);
  }

  @Override
  public boolean next() throws IOException {
    columns.reset();
    while (!finished && columns.rows() < BATCH_ROWS) {
      if (inEntry && !entry.done()) {
        entry.fill(columns, BATCH_ROWS - columns.rows(), p.segFirst, p.lo, p.hi);
        continue;
      }
      inEntry = false;
      try {
        if (!entries.advance()) {
          finished = true;
          break;
        }
      } catch (EntryStream.LedgerLostException e) {
        lost();
        finished = true;
        break;
      }
      try {
        entry.open(entries.view, entries.buf, entries.payloadStart, entries.payloadEnd - entries.payloadStart);
      } catch (CorruptEntryException e) {
        // its digest held, so the writer wrote it so: no replica holds a better copy
        throw new PybkScanException("log '" + p.log + "': entry " + p.ledgerId + ":" + entries.entryId
            + " is not a record entry: " + e.getMessage());
      }
      if (p.segFirst + entry.firstIndex() >= p.hi) {
        finished = true;
        break;
      }
      inEntry = true;
    }
    return columns.rows() > 0;
  }

  private void lost() {
    String what = "log '" + p.log + "': offsets " + p.lo + "-" + (p.hi - 1) + " (segment ledger " + p.ledgerId
        + ") were truncated away while the query read them";
    if (p.failOnDataLoss) {
      throw new PybkScanException("data loss: " + what + "; to skip lost records and go on, set option "
          + "failOnDataLoss=false");
    }
    LOG.warn("pybk: " + what + "; skipped (failOnDataLoss=false)");
  }

  @Override
  public ColumnarBatch get() {
    return columns.batch();
  }

  @Override
  public void close() {
    entries.close();
    columns.close();
  }
}
