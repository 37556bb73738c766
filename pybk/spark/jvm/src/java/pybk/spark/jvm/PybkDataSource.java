package pybk.spark.jvm;

import java.util.Map;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.execution.datasources.v2.python.PythonDataSourceV2;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * format("pybk") when pybk's jar is on Spark's classpath: batch scans of named logs are read by
 * the JVM (LogScan); everything else (ledgers, streams, writes, and the schema) is the Python
 * source's, which pybk.spark.register also registers as "pybk_python" and which this source
 * hands those on to. Spark resolves a format name to a JVM source before a Python one, so this
 * source takes the name whenever the jar is there; without it, "pybk" is the Python source.
 */
public final class PybkDataSource implements TableProvider, DataSourceRegister {
  /** The name the Python source is registered under for this source to hand reads to. */
  public static final String PYTHON_NAME = "pybk_python";

  private final PythonDataSourceV2 python = python();

  /**
   * A new handle on the Python source: each caches the read it plans (its Python reader and
   * schema), so a scan of other columns needs its own.
   */
  private static PythonDataSourceV2 python() {
    PythonDataSourceV2 p = new PythonDataSourceV2();
    p.setShortName(PYTHON_NAME);
    return p;
  }

  @Override
  public String shortName() {
    return "pybk";
  }

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    return python.inferSchema(options);
  }

  @Override
  public Transform[] inferPartitioning(CaseInsensitiveStringMap options) {
    return python.inferPartitioning(options);
  }

  @Override
  public boolean supportsExternalMetadata() {
    return python.supportsExternalMetadata();
  }

  @Override
  public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
    Table table = python.getTable(schema, partitioning, properties);
    if (table instanceof SupportsRead && Planners.get().handles(Planners.json(properties))) {
      return new LogTable(table, schema, s -> python().getTable(s, partitioning, properties));
    }
    return table;
  }
}
