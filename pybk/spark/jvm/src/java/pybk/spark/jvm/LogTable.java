package pybk.spark.jvm;

import java.util.Map;
import java.util.Set;
import java.util.function.Function;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * The Python source's table of a log read, whose batch scans the JVM reads (LogScan); its
 * capabilities, schema, streams and writes stay the Python table's.
 */
final class LogTable implements SupportsRead, SupportsWrite {
  private final Table python;
  private final StructType schema;
  private final Function<StructType, Table> pythonWith;

  /** pythonWith: the Python source's table of a (pruned) schema, for what the JVM hands on. */
  LogTable(Table python, StructType schema, Function<StructType, Table> pythonWith) {
    this.python = python;
    this.schema = schema;
    this.pythonWith = pythonWith;
  }

  @Override
  public String name() {
    return python.name();
  }

  @Override
  @SuppressWarnings("deprecation")
  public StructType schema() {
    return schema != null ? schema : python.schema();
  }

  @Override
  public Map<String, String> properties() {
    return python.properties();
  }

  @Override
  public Set<TableCapability> capabilities() {
    return python.capabilities();
  }

  @Override
  public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
    return new LogScanBuilder(options, schema(), pythonWith);
  }

  @Override
  public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
    if (!(python instanceof SupportsWrite)) {
      throw new UnsupportedOperationException("pybk: this table cannot be written");
    }
    return ((SupportsWrite) python).newWriteBuilder(info);
  }
}
