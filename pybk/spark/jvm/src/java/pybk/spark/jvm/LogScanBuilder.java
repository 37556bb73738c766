package pybk.spark.jvm;

import java.util.function.Function;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * Builds a log scan of the columns the query needs: Spark prunes the others, so they are never
 * built (a count reads one column, offset: a scan has at least one).
 */
final class LogScanBuilder implements ScanBuilder, SupportsPushDownRequiredColumns {
  private final CaseInsensitiveStringMap options;
  private final Function<StructType, Table> pythonWith;
  private StructType schema;

  LogScanBuilder(CaseInsensitiveStringMap options, StructType schema, Function<StructType, Table> pythonWith) {
    this.options = options;
    this.schema = schema;
    this.pythonWith = pythonWith;
  }

  @Override
  public void pruneColumns(StructType required) {
    if (required.fields().length > 0) {
      schema = required;
      return;
    }
    for (StructField f : schema.fields()) {
      if (f.name().equals("offset")) {
        schema = new StructType(new StructField[] {f});
        return;
      }
    }
    schema = new StructType(new StructField[] {schema.fields()[0]});
  }

  @Override
  public Scan build() {
    return new LogScan(options, schema, pythonWith);
  }
}
