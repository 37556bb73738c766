package pybk.spark.jvm;

/**
 * The driver's Python side of the pybk source, called over py4j: which reads the JVM takes, and
 * what a log scan reads. Python holds every rule of planning (which logs, where a scan starts
 * and ends, data loss, credentials); the JVM only reads what it is told.
 */
public interface Planner {
  /** Whether a read with these options (a JSON object of strings) is a log scan the JVM reads. */
  boolean handles(String optionsJson);

  /**
   * The plan of a batch scan as JSON: {"partitions": [...]} (see LogPlan), or
   * {"python": reason} when the Python reader must do it, or {"error": message} for a scan
   * that must fail (the message names the cause on its first line).
   */
  String plan(String optionsJson, String schemaJson);
}
