package pybk.spark.jvm;

import java.nio.ByteBuffer;
import java.security.GeneralSecurityException;
import java.security.MessageDigest;
import java.util.zip.CRC32C;
import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;

/**
 * Checks an entry body as pybk/entry.py's decode does: ledger_id u64 | entry_id u64 | lac i64 |
 * length u64 | digest | payload, the digest (CRC32C, or HMAC-SHA256 keyed by the ledger's
 * password) over the 32-byte header and the payload. A body that fails is a corrupt replica:
 * the reader reads the entry from another.
 */
final class EntryVerifier {
  static final int HEADER_SIZE = 32;

  private final long ledgerId;
  private final Digest digest;
  private final CRC32C crc = new CRC32C();
  private final Mac mac;
  private final byte[] macOut = new byte[32];

  EntryVerifier(long ledgerId, Digest digest, byte[] password) {
    this.ledgerId = ledgerId;
    this.digest = digest;
    if (digest == Digest.MAC) {
      try {
        mac = Mac.getInstance("HmacSHA256");
        // HMAC pads a short key with zeros to its block: an empty password is 64 zero bytes
        mac.init(new SecretKeySpec(password.length == 0 ? new byte[64] : password, "HmacSHA256"));
      } catch (GeneralSecurityException e) {
        throw new IllegalStateException("pybk: no HmacSHA256 in this JVM: " + e, e);
      }
    } else {
      mac = null;
    }
  }

  /** Where the payload of the body buf[off, off + size) starts; CorruptEntryException if it is not entry entryId intact. */
  int payloadStart(byte[] buf, int off, int size, long entryId) throws CorruptEntryException {
    int start = HEADER_SIZE + digest.size;
    if (size < start) {
      throw new CorruptEntryException("entry " + ledgerId + ":" + entryId + ": body of " + size
          + " bytes is shorter than its header and digest (" + start + ")");
    }
    ByteBuffer b = ByteBuffer.wrap(buf, off, size);
    long lid = b.getLong(off);
    long eid = b.getLong(off + 8);
    long length = b.getLong(off + 24);
    if (lid != ledgerId || eid != entryId) {
      throw new CorruptEntryException("asked for entry " + ledgerId + ":" + entryId + ", got "
          + Long.toUnsignedString(lid) + ":" + eid);
    }
    int payload = size - start;
    if (Long.compareUnsigned(length, payload) < 0) {
      throw new CorruptEntryException("entry " + ledgerId + ":" + entryId + ": the ledger length says "
          + Long.toUnsignedString(length) + " but the payload is " + payload + " bytes");
    }
    if (digest == Digest.CRC32C) {
      crc.reset();
      crc.update(buf, off, HEADER_SIZE);
      crc.update(buf, off + start, payload);
      if ((int) crc.getValue() != b.getInt(off + HEADER_SIZE)) {
        throw new CorruptEntryException("entry " + ledgerId + ":" + entryId + ": CRC32C digest mismatch");
      }
    } else {
      mac.update(buf, off, HEADER_SIZE);
      mac.update(buf, off + start, payload);
      try {
        mac.doFinal(macOut, 0);
      } catch (GeneralSecurityException e) {
        throw new IllegalStateException(e);
      }
      if (!MessageDigest.isEqual(macOut, java.util.Arrays.copyOfRange(buf, off + HEADER_SIZE, off + start))) {
        throw new CorruptEntryException("entry " + ledgerId + ":" + entryId + ": MAC digest mismatch");
      }
    }
    return off + start;
  }
}
