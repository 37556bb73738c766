package pybk.spark.jvm;

import java.util.Map;
import java.util.TreeMap;

/** The planner the driver's Python registered (pybk.spark.register), and the calls to it. */
public final class Planners {
  private static volatile Planner planner;

  private Planners() {}

  /** Called from Python (py4j) when pybk registers with a session. */
  public static void register(Planner p) {
    planner = p;
  }

  /** The registered planner; an error that says how to get one when there is none. */
  static Planner get() {
    Planner p = planner;
    if (p == null) {
      throw new IllegalStateException(
          "pybk: this Spark session has no pybk planner: call pybk.spark.register(spark) from the "
              + "driver's Python first (pybk.spark.session.local_session does)");
    }
    return p;
  }

  /** Options as the planner's JSON object (sorted keys, string values). */
  static String json(Map<String, String> options) {
    try {
      return Json.MAPPER.writeValueAsString(new TreeMap<>(options));
    } catch (Exception e) {
      throw new IllegalStateException("pybk: options cannot be written as JSON: " + e, e);
    }
  }
}
