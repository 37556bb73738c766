package pybk.spark.jvm;

import java.io.IOException;

/**
 * A failed Read call or connection. Its message's first line names the bookie and the cause.
 * {@code status} is the bookie's pybk Status (NO_LEDGER = 1, NO_ENTRY = 2, ...), 1000 + the gRPC
 * status for a call the server ended with one (1016 = UNAUTHENTICATED), or -1 for a transport error
 * (no connection, reset, timeout, malformed answer).
 */
public class BookieReadException extends IOException {
  private static final long serialVersionUID = 1L;

  /** A failure of the transport, not an answer of the bookie. */
  public static final int TRANSPORT = -1;
  /** Added to a gRPC status to tell it from a pybk Status. */
  public static final int GRPC = 1000;

  public final String address;
  public final int status;

  public BookieReadException(String address, int status, String message) {
    this(address, status, message, null);
  }

  public BookieReadException(String address, int status, String message, Throwable cause) {
    super("bookie " + address + ": " + message, cause);
    this.address = address;
    this.status = status;
  }

  /** The status's name: a pybk Status, a gRPC status (UNAUTHENTICATED, ...) or TRANSPORT. */
  public String statusName() {
    return Statuses.name(status);
  }
}
