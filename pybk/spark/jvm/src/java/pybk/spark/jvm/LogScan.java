package pybk.spark.jvm;

import java.util.function.Function;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * A scan of named logs: batches read by the JVM (LogBatch), streams by the Python source (with
 * the same columns: the Python source reads a narrower schema too).
 */
final class LogScan implements Scan {
  private final CaseInsensitiveStringMap options;
  private final StructType schema;
  private final Function<StructType, Table> pythonWith;

  LogScan(CaseInsensitiveStringMap options, StructType schema, Function<StructType, Table> pythonWith) {
    this.options = options;
    this.schema = schema;
    this.pythonWith = pythonWith;
  }

  private Scan python() {
    return ((SupportsRead) pythonWith.apply(schema)).newScanBuilder(options).build();
  }

  @Override
  public StructType readSchema() {
    return schema;
  }

  @Override
  public String description() {
    return "pybk log scan (JVM reader)";
  }

  @Override
  public Batch toBatch() {
    return new LogBatch(options, schema, () -> python().toBatch());
  }

  @Override
  public MicroBatchStream toMicroBatchStream(String checkpointLocation) {
    return python().toMicroBatchStream(checkpointLocation);
  }

  @Override
  public ColumnarSupportMode columnarSupportMode() {
    return ColumnarSupportMode.PARTITION_DEFINED;
  }
}
