package pybk.spark.jvm;

import io.netty.buffer.Unpooled;
import io.netty.channel.EventLoopGroup;
import io.netty.channel.MultiThreadIoEventLoopGroup;
import io.netty.channel.nio.NioIoHandler;
import io.netty.handler.codec.http2.DefaultHttp2DataFrame;
import io.netty.handler.codec.http2.DefaultHttp2Headers;
import io.netty.handler.codec.http2.DefaultHttp2HeadersFrame;
import io.netty.handler.codec.http2.Http2Headers;
import io.netty.handler.codec.http2.Http2SecurityUtil;
import io.netty.handler.codec.http2.Http2StreamChannel;
import io.netty.handler.ssl.ApplicationProtocolConfig;
import io.netty.handler.ssl.ApplicationProtocolNames;
import io.netty.handler.ssl.OpenSsl;
import io.netty.handler.ssl.SslContext;
import io.netty.handler.ssl.SslContextBuilder;
import io.netty.handler.ssl.SslProvider;
import io.netty.handler.ssl.SupportedCipherSuiteFilter;
import io.netty.util.concurrent.DefaultThreadFactory;
import io.netty.util.concurrent.Future;
import java.io.File;
import java.io.IOException;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;

/**
 * The connections to bookies of one JVM (an executor), shared by its tasks: one HTTP/2 connection per
 * (address, security), its calls multiplexed, a new one after it failed or was told to go away. The
 * event loop threads are daemons, so an executor can exit with connections open.
 */
public final class BookieConnections {
  private static final String READ_PATH = "/pybk.Bookie/Read";
  private static volatile BookieConnections shared;

  private final EventLoopGroup group;
  private final Map<Key, BookieConnection> connections = new ConcurrentHashMap<>();
  private final Map<BookieSecurity, SslContext> sslContexts = new ConcurrentHashMap<>();

  private static final class Key {
    final String address;
    final BookieSecurity security;

    Key(String address, BookieSecurity security) {
      this.address = address;
      this.security = security;
    }

    @Override
    public boolean equals(Object o) {
      return o instanceof Key && ((Key) o).address.equals(address) && ((Key) o).security.equals(security);
    }

    @Override
    public int hashCode() {
      return address.hashCode() * 31 + security.hashCode();
    }
  }

  BookieConnections(int threads) {
    group = new MultiThreadIoEventLoopGroup(threads, new DefaultThreadFactory("pybk-bookie-io", true),
        NioIoHandler.newFactory());
  }

  /** The process-wide instance (event loop threads: up to 4, fewer on fewer cores). */
  public static BookieConnections shared() {
    BookieConnections s = shared;
    if (s == null) {
      synchronized (BookieConnections.class) {
        s = shared;
        if (s == null) {
          s = new BookieConnections(Math.max(1, Math.min(4, Runtime.getRuntime().availableProcessors())));
          shared = s;
        }
      }
    }
    return s;
  }

  /**
   * Starts a packed Read call of entries first..last of a ledger at the bookie at host:port. timeoutMs
   * bounds the connection (and TLS handshake) and every wait for an answer. The caller closes the stream.
   */
  public PackedStream readPacked(String address, BookieSecurity sec, long ledgerId, long first, long last,
                                 long timeoutMs) throws BookieReadException {
    if (sec == null) {
      sec = BookieSecurity.NONE;
    }
    if (timeoutMs <= 0) {
      throw new IllegalArgumentException("timeoutMs must be positive, not " + timeoutMs);
    }
    String token;
    try {
      token = sec.token();
    } catch (IOException e) {
      throw new BookieReadException(address, BookieReadException.TRANSPORT, "cannot read the token: " + e, e);
    }
    Key key = new Key(address, sec);
    BookieConnection conn = connection(key, timeoutMs);
    PackedStream stream = new PackedStream(address, timeoutMs);
    boolean established = conn.established();
    Http2StreamChannel ch;
    try {
      ch = open(conn, stream, timeoutMs);
    } catch (BookieReadException e) {
      connections.remove(key, conn);
      conn.close();
      if (!established) {
        throw e;
      }
      ch = open(connection(key, timeoutMs), stream, timeoutMs);   // it broke since its last call: once more, anew
    }
    stream.attach(ch);
    Http2StreamChannel call = ch;
    Http2Headers h = new DefaultHttp2Headers().method("POST").scheme(sec.tls() ? "https" : "http")
        .path(READ_PATH).authority(address);
    h.add("content-type", "application/grpc");
    h.add("te", "trailers");
    h.add("user-agent", "pybk-jvm");
    if (token != null) {
      h.add("authorization", "Bearer " + token);
    }
    byte[] request = ReadProto.readRequest(ledgerId, first, last);
    byte[] framed = new byte[5 + request.length];
    framed[1] = (byte) (request.length >>> 24);
    framed[2] = (byte) (request.length >>> 16);
    framed[3] = (byte) (request.length >>> 8);
    framed[4] = (byte) request.length;
    System.arraycopy(request, 0, framed, 5, request.length);
    call.write(new DefaultHttp2HeadersFrame(h, false));
    call.writeAndFlush(new DefaultHttp2DataFrame(Unpooled.wrappedBuffer(framed), true)).addListener(f -> {
      if (!f.isSuccess()) {
        call.pipeline().fireExceptionCaught(f.cause());
      }
    });
    return stream;
  }

  private Http2StreamChannel open(BookieConnection conn, PackedStream stream, long timeoutMs)
      throws BookieReadException {
    conn.await(timeoutMs);
    Future<Http2StreamChannel> f = conn.openStream(new ReadStreamHandler(stream, conn.address));
    try {
      if (!f.await(timeoutMs, TimeUnit.MILLISECONDS)) {
        f.cancel(false);
        throw new BookieReadException(conn.address, BookieReadException.TRANSPORT, "no stream within " + timeoutMs
            + " ms");
      }
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new BookieReadException(conn.address, BookieReadException.TRANSPORT, "interrupted opening a stream", e);
    }
    if (!f.isSuccess()) {
      throw new BookieReadException(conn.address, BookieReadException.TRANSPORT,
          "cannot open a stream: " + BookieConnection.describe(f.cause()), f.cause());
    }
    return f.getNow();
  }

  /** The usable connection for key, a new one if there is none (the one it replaces is closed). */
  private BookieConnection connection(Key key, long timeoutMs) throws BookieReadException {
    BookieConnection conn = connections.get(key);
    if (conn != null && conn.usable()) {
      return conn;
    }
    SslContext ssl = key.security.tls() ? sslContext(key.address, key.security) : null;
    synchronized (this) {
      BookieConnection now = connections.get(key);
      if (now != null && now.usable()) {
        return now;
      }
      if (now != null) {
        now.close();
      }
      BookieConnection fresh = BookieConnection.open(group, key.address, ssl, key.security,
          (int) Math.min(timeoutMs, Integer.MAX_VALUE));
      connections.put(key, fresh);
      fresh.closeFuture().addListener(f -> connections.remove(key, fresh));   // no dead connection kept
      return fresh;
    }
  }

  private SslContext sslContext(String address, BookieSecurity sec) throws BookieReadException {
    SslContext ctx = sslContexts.get(sec);
    if (ctx != null) {
      return ctx;
    }
    try {
      SslContextBuilder b = SslContextBuilder.forClient()
          .sslProvider(OpenSsl.isAlpnSupported() ? SslProvider.OPENSSL : SslProvider.JDK)
          .trustManager(new File(sec.caFile))
          .ciphers(Http2SecurityUtil.CIPHERS, SupportedCipherSuiteFilter.INSTANCE)
          .applicationProtocolConfig(new ApplicationProtocolConfig(ApplicationProtocolConfig.Protocol.ALPN,
              ApplicationProtocolConfig.SelectorFailureBehavior.NO_ADVERTISE,
              ApplicationProtocolConfig.SelectedListenerFailureBehavior.ACCEPT, ApplicationProtocolNames.HTTP_2));
      if (sec.certFile != null) {
        b.keyManager(new File(sec.certFile), new File(sec.keyFile));
      }
      ctx = b.build();
    } catch (IOException | RuntimeException e) {
      throw new BookieReadException(address, BookieReadException.TRANSPORT, "TLS settings (" + sec + "): " + e, e);
    }
    sslContexts.putIfAbsent(sec, ctx);
    return sslContexts.get(sec);
  }
}
