package pybk.spark.jvm;

import java.nio.ByteBuffer;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The verified entries of one partition, in order, streamed from the bookies as packed range
 * reads (one call per fragment of the ledger, to one replica). What a replica does not deliver
 * (it fails, lags behind, times out, or holds a corrupt entry) is read from the next replica of
 * the fragment, from the first entry missing; the partition fails only when no replica delivers
 * an entry. Replicas are taken in turn from one chosen by the partition, to spread partitions
 * over the bookies.
 */
final class EntryStream implements AutoCloseable {
  private static final Logger LOG = LoggerFactory.getLogger("pybk.spark");   // Spark's logging (log4j)

  private final LogInputPartition p;
  private final BookieConnections connections;
  private final BookieSecurity security;
  private final EntryVerifier verifier;
  private long next;              // the next entry to deliver
  private int replica;            // which replica of a fragment is read: one on from the last that failed
  private int tries;              // replicas of the current fragment tried since the last progress
  private int lost;               // of those, how many hold nothing of the ledger
  private BookieReadException lastError;
  private String lastCause;
  private PackedStream stream;
  private String bookie;
  private long streamLast;
  private PackedAnswer answer;
  private ByteBuffer answerView;
  private int bodyIndex;
  private int bodyOffset;

  // the entry delivered by the last advance()
  byte[] buf;
  ByteBuffer view;
  int payloadStart;
  int payloadEnd;
  long entryId;

  EntryStream(LogInputPartition p, BookieConnections connections) {
    this.p = p;
    this.connections = connections;
    this.security = p.security != null ? p.security : BookieSecurity.fromEnv(p.securityEnv);
    this.verifier = new EntryVerifier(p.ledgerId, p.digest, p.password);
    this.next = p.firstEntry;
    this.replica = (int) Math.floorMod(p.ledgerId * 31 + p.firstEntry, 1L << 30);
  }

  /**
   * The next verified entry into buf/view/payloadStart/payloadEnd/entryId; false after the last.
   * LedgerLostException when every replica of a fragment holds nothing of the ledger (deleted).
   */
  boolean advance() throws BookieReadException, LedgerLostException {
    while (next <= p.lastEntry) {
      if (answer != null && bodyIndex < answer.sizes.length) {
        int size = answer.sizes[bodyIndex];
        long id = answer.firstEntry + bodyIndex;
        try {
          if (id != next) {
            throw new CorruptEntryException("bookie sent entry " + id + " where " + next + " was due");
          }
          int start = verifier.payloadStart(answer.bodies, bodyOffset, size, id);
          buf = answer.bodies;
          view = answerView;
          payloadStart = start;
          payloadEnd = bodyOffset + size;
          entryId = id;
        } catch (CorruptEntryException e) {
          LOG.warn("ledger " + p.ledgerId + " entry " + id + ": corrupt replica on bookie " + bookie + " (" + e
              .getMessage() + "); reading another replica");
          failed(null, e.getMessage());
          continue;
        }
        bodyIndex++;
        bodyOffset += size;
        next++;
        tries = 0;
        lost = 0;
        return true;
      }
      answer = null;
      if (stream == null) {
        open();
        if (stream == null) {
          continue;
        }
      }
      try {
        PackedAnswer a = stream.next();
        if (a == null) {
          closeStream();
          if (next <= streamLast) {
            failed(null, "the stream ended at entry " + next + " before entry " + streamLast);
          }
          continue;
        }
        answer = a;
        answerView = ByteBuffer.wrap(a.bodies);
        bodyIndex = 0;
        bodyOffset = 0;
      } catch (BookieReadException e) {
        failed(e, e.getMessage());
      }
    }
    return false;
  }

  /** A read of the rest of the current fragment from its next replica. */
  private void open() throws BookieReadException, LedgerLostException {
    int f = p.fragmentOf(next);
    String[] ensemble = p.fragmentBookies[f];
    if (tries >= ensemble.length) {
      if (lost == ensemble.length) {
        throw new LedgerLostException();
      }
      String cause = "no replica of ledger " + p.ledgerId + " delivered entry " + next + " (bookies "
          + String.join(", ", ensemble) + "); last: " + lastCause;
      throw lastError != null ? new BookieReadException(lastError.address, lastError.status, cause)
          : new BookieReadException(ensemble[0], -1, cause);
    }
    bookie = ensemble[replica % ensemble.length];
    streamLast = Math.min(p.lastEntry, p.fragmentLast(f));
    tries++;
    try {
      stream = connections.readPacked(bookie, security, p.ledgerId, next, streamLast, p.timeoutMs);
    } catch (BookieReadException e) {
      failed(e, e.getMessage());
    }
  }

  private void failed(BookieReadException e, String cause) {
    replica++;
    if (e != null && e.status == Statuses.NO_LEDGER) {
      lost++;
    }
    if (e != null) {
      lastError = e;
    }
    lastCause = cause;
    if (LOG.isInfoEnabled()) {
      LOG.info("ledger " + p.ledgerId + ": range read " + next + ".." + streamLast + " from " + bookie + " stopped: "
          + cause);
    }
    answer = null;
    closeStream();
  }

  private void closeStream() {
    if (stream != null) {
      stream.close();
      stream = null;
    }
  }

  @Override
  public void close() {
    closeStream();
  }

  /** Every replica said the ledger is not there: the segment was deleted (truncated) under the scan. */
  static final class LedgerLostException extends Exception {
    LedgerLostException() {
      super("ledger deleted");
    }
  }
}
