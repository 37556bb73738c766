package pybk.spark.jvm;

import org.apache.spark.sql.connector.read.InputPartition;

/**
 * Entries [firstEntry, lastEntry] of one segment's ledger, keeping records lo <= offset < hi
 * (an entry's records are numbered from segFirst + its first index). The ledger's ensembles:
 * fragment i holds entries from fragmentFirsts[i] on, on bookies fragmentBookies[i]
 * (host:port, every entry on each: the planner hands only whole-copy ensembles to the JVM).
 */
final class LogInputPartition implements InputPartition {
  private static final long serialVersionUID = 1L;

  final String log;
  final long ledgerId;
  final long firstEntry;
  final long lastEntry;
  final long segFirst;
  final long lo;
  final long hi;
  final Digest digest;
  final byte[] password;
  final long[] fragmentFirsts;
  final String[][] fragmentBookies;
  final BookieSecurity security;          // null: the executor's environment's (securityEnv)
  final java.util.HashMap<String, String> securityEnv;
  final boolean failOnDataLoss;
  final long timeoutMs;

  LogInputPartition(String log, long ledgerId, long firstEntry, long lastEntry, long segFirst, long lo, long hi,
      Digest digest, byte[] password, long[] fragmentFirsts, String[][] fragmentBookies, BookieSecurity security,
      java.util.HashMap<String, String> securityEnv, boolean failOnDataLoss, long timeoutMs) {
    this.log = log;
    this.ledgerId = ledgerId;
    this.firstEntry = firstEntry;
    this.lastEntry = lastEntry;
    this.segFirst = segFirst;
    this.lo = lo;
    this.hi = hi;
    this.digest = digest;
    this.password = password;
    this.fragmentFirsts = fragmentFirsts;
    this.fragmentBookies = fragmentBookies;
    this.security = security;
    this.securityEnv = securityEnv;
    this.failOnDataLoss = failOnDataLoss;
    this.timeoutMs = timeoutMs;
  }

  /** The fragment holding entry e (the last whose first entry is at or below it). */
  int fragmentOf(long e) {
    int f = 0;
    while (f + 1 < fragmentFirsts.length && fragmentFirsts[f + 1] <= e) {
      f++;
    }
    return f;
  }

  /** The last entry of fragment f (or Long.MAX_VALUE for the last fragment). */
  long fragmentLast(int f) {
    return f + 1 < fragmentFirsts.length ? fragmentFirsts[f + 1] - 1 : Long.MAX_VALUE;
  }

  @Override
  public String toString() {
    return "LogInputPartition(" + log + ", ledger " + ledgerId + ", entries " + firstEntry + "-" + lastEntry
        + ", offsets " + lo + "-" + hi + ")";
  }
}
