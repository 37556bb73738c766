package pybk.spark.jvm;

import io.netty.buffer.ByteBuf;
import io.netty.channel.Channel;
import io.netty.channel.ChannelHandlerContext;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * One Read call's answers as they arrive, for one consumer thread. The event loop queues whole gRPC
 * messages and stops reading the HTTP/2 stream once {@link #MAX_QUEUED} wait; the consumer decodes
 * them (so the shared event loop only frames) and asks for more as it takes them. The server can then
 * be ahead by the stream's window and no more: Netty returns credit only for frames the stream reads.
 */
public final class PackedStream implements AutoCloseable {
  /** Whole messages queued before the stream stops reading. */
  static final int MAX_QUEUED = 2;
  /** How long close() waits for the stream's reset to be written: once it returns, the call is over. */
  private static final long CLOSE_WAIT_MS = 1000;
  private static final Object END = new Object();

  private final String address;
  private final long timeoutMs;
  private final LinkedBlockingQueue<Object> queue = new LinkedBlockingQueue<>();
  private final AtomicInteger queued = new AtomicInteger();
  private final AtomicBoolean paused = new AtomicBoolean();
  private final AtomicBoolean closed = new AtomicBoolean();
  private volatile Channel channel;
  private boolean closedOnLoop;
  private boolean finished;
  private BookieReadException failure;

  PackedStream(String address, long timeoutMs) {
    this.address = address;
    this.timeoutMs = timeoutMs;
  }

  void attach(Channel channel) {
    this.channel = channel;
  }

  /**
   * The next answer with entries, or null after the last answer of a successful call. Waits at most
   * the call's timeout for it; a status other than OK is thrown after the entries of its answer.
   */
  public PackedAnswer next() throws BookieReadException {
    while (true) {
      if (failure != null) {
        throw failure;
      }
      if (finished) {
        return null;
      }
      if (closed.get()) {
        throw new BookieReadException(address, BookieReadException.TRANSPORT, "read of a closed stream");
      }
      Object item;
      try {
        item = queue.poll(timeoutMs, TimeUnit.MILLISECONDS);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        close();
        throw new BookieReadException(address, BookieReadException.TRANSPORT, "interrupted waiting for an answer", e);
      }
      if (item == null) {
        fail(new BookieReadException(address, BookieReadException.TRANSPORT,
            "no answer within " + timeoutMs + " ms"));
      } else if (item == END) {
        finished = true;
      } else if (item instanceof BookieReadException) {
        fail((BookieReadException) item);
      } else {
        PackedAnswer answer = decode((ByteBuf) item);
        if (answer != null) {
          return answer;
        }
      }
    }
  }

  private PackedAnswer decode(ByteBuf message) throws BookieReadException {
    ReadProto.Results r;
    try {
      queued.decrementAndGet();
      resume();
      r = ReadProto.readResults(message, address);
    } catch (BookieReadException e) {
      fail(e);
      return null;
    } finally {
      message.release();
    }
    if (r.status != Statuses.OK) {
      String missing = r.status == Statuses.NO_ENTRY ? " (entry " + r.missingEntry + ")" : "";
      failure = new BookieReadException(address, r.status, Statuses.name(r.status) + missing
          + (r.message.isEmpty() ? "" : ": " + r.message));
      close();
    }
    return r.sizes.length > 0 ? new PackedAnswer(r.firstBodyEntry, r.bodies, r.sizes) : null;
  }

  private void fail(BookieReadException e) throws BookieReadException {
    failure = e;
    close();
    throw e;
  }

  /**
   * Cancels the call (RST_STREAM) if it has not ended and releases what it holds. Idempotent; waits
   * briefly for the reset to be written, so that a JVM may exit right after.
   */
  @Override
  public void close() {
    if (!closed.compareAndSet(false, true)) {
      return;
    }
    Channel ch = channel;
    if (ch == null) {
      return;
    }
    try {
      ch.eventLoop().execute(() -> {
        closedOnLoop = true;
        drain();
        queue.add(new BookieReadException(address, BookieReadException.TRANSPORT, "the stream was closed"));
        ch.close();
      });
    } catch (RejectedExecutionException e) {
      drain();
      return;
    }
    if (!ch.eventLoop().inEventLoop()) {
      ch.closeFuture().awaitUninterruptibly(CLOSE_WAIT_MS);
    }
  }

  private void drain() {
    for (Object item; (item = queue.poll()) != null; ) {
      if (item instanceof ByteBuf) {
        ((ByteBuf) item).release();
      }
    }
  }

  /** Asks the stream for more when the consumer took a message from a full queue. */
  private void resume() {
    Channel ch = channel;
    if (queued.get() < MAX_QUEUED && paused.compareAndSet(true, false)) {
      ch.eventLoop().execute(() -> {
        if (!closedOnLoop) {
          ch.read();
        }
      });
    }
  }

  /* The event loop's side. */

  /** A whole gRPC message (owned from now on). */
  void offer(ByteBuf message) {
    if (closedOnLoop) {
      message.release();
      return;
    }
    queued.incrementAndGet();
    queue.add(message);
  }

  void end() {
    queue.add(END);
  }

  void error(BookieReadException e) {
    queue.add(e);
  }

  /** Reads on unless the queue is full; then the consumer's next take asks again (resume). */
  void readMore(ChannelHandlerContext ctx) {
    if (closedOnLoop) {
      return;
    }
    if (queued.get() < MAX_QUEUED) {
      ctx.read();
      return;
    }
    paused.set(true);
    if (queued.get() < MAX_QUEUED && paused.compareAndSet(true, false)) {
      ctx.read();
    }
  }
}
