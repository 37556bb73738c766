package pybk.spark.jvm;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.function.Supplier;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * A batch scan of logs: the driver's Python plans it (Planner.plan); the partitions it returns
 * are read by LogPartitionReader. A plan the JVM cannot read (the planner says "python") is
 * read by the Python source's batch instead, whole.
 */
final class LogBatch implements Batch {
  private final CaseInsensitiveStringMap options;
  private final StructType schema;
  private final Supplier<Batch> pythonBatch;
  private InputPartition[] partitions;
  private Batch python;

  LogBatch(CaseInsensitiveStringMap options, StructType schema, Supplier<Batch> pythonBatch) {
    this.options = options;
    this.schema = schema;
    this.pythonBatch = pythonBatch;
  }

  @Override
  public synchronized InputPartition[] planInputPartitions() {
    if (partitions == null) {
      JsonNode plan = LogPlan.parse(Planners.get().plan(Planners.json(options.asCaseSensitiveMap()), schema.json()));
      if (plan.has("python")) {
        python = pythonBatch.get();
        partitions = python.planInputPartitions();
      } else {
        partitions = LogPlan.partitions(plan);
      }
    }
    return partitions;
  }

  @Override
  public PartitionReaderFactory createReaderFactory() {
    planInputPartitions();
    return python != null ? python.createReaderFactory() : new LogReaderFactory(schema);
  }
}
