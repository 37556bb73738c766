package pybk.spark.jvm;

/** Names of the bookie's pybk Status codes and of gRPC status codes, for messages. */
final class Statuses {
  static final int OK = 0;
  static final int NO_LEDGER = 1;
  static final int NO_ENTRY = 2;

  private static final String[] PYBK = {"OK", "NO_LEDGER", "NO_ENTRY", "BAD_REQUEST", "IO_ERROR", "UNAUTHORIZED",
      "FENCED", "READ_ONLY", "TOO_MANY_REQUESTS", "ACCESS_DENIED", "ENTRY_EXISTS"};
  private static final String[] GRPC = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
      "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",
      "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};

  private Statuses() {
  }

  /** The name of a BookieReadException status: pybk Status, GRPC + gRPC status, or TRANSPORT. */
  static String name(int status) {
    if (status == BookieReadException.TRANSPORT) {
      return "TRANSPORT";
    }
    if (status >= BookieReadException.GRPC) {
      return grpc(status - BookieReadException.GRPC);
    }
    return status >= 0 && status < PYBK.length ? PYBK[status] : "STATUS_" + status;
  }

  static String grpc(int code) {
    return code >= 0 && code < GRPC.length ? GRPC[code] : "GRPC_STATUS_" + code;
  }
}
