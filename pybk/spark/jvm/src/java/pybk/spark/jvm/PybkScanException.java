package pybk.spark.jvm;

/**
 * A scan that cannot go on; its message names the cause on its first line (as Python's errors
 * do). An IllegalArgumentException because PySpark shows one raised while a query is planned
 * (bad options, a log that does not exist) as its message alone, not as a Java stack.
 */
public final class PybkScanException extends IllegalArgumentException {
  public PybkScanException(String message) {
    super(message);
  }

  public PybkScanException(String message, Throwable cause) {
    super(message, cause);
  }
}
