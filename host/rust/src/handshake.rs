//! The broker's side of a lock's handshake (protocol/_server_session.py), for the
//! ingest (ingest.rs): the CONNECT it serves, the CHALLENGE it answers and the session
//! transcript both ends sign (protocol/_auth.py). Byte for byte the Python session's:
//! tests/protocol/test_handshake_core.py holds the two equal on the shared vectors
//! (protocol/session_vectors.json) and on random and damaged input.
//!
//! It serves only what it fully understands -- one whole CONNECT of a lock, no flag
//! set, a valid SN, a well-formed body, nothing after it -- and leaves every other
//! input to the Python session, which raises the protocol's own errors.

use sha2::{Digest, Sha256};

use crate::bytes::be32;
use crate::consts::*;
use crate::frame::{self, check_header, view_frame, Check};

/// protocol/_auth.py TRANSCRIPT_DOMAIN
pub const TRANSCRIPT_DOMAIN: &[u8] = b"lockmq-transcript-v1";
/// the methods a CHALLENGE offers (ServerSession.challenge's default: device HMAC and token)
pub const CHALLENGE_METHODS: u8 = AUTH_DEVICE_HMAC | AUTH_TOKEN;

/// A lock's CONNECT, as the Python session would take it.
#[derive(Debug, PartialEq, Eq)]
pub struct LockConnect<'a> {
    pub sn: &'a [u8],
    pub opaque: u32,
    pub body: &'a [u8],
    /// the largest frame the lock can receive (0: unstated)
    pub max_frame: u32,
}

/// What the bytes a socket sent before its CHALLENGE say.
#[derive(Debug, PartialEq, Eq)]
pub enum Connect<'a> {
    /// no bad byte yet, not a whole frame yet
    Partial,
    /// anything else: the Python session's to read (and refuse, if it must)
    Other,
    /// exactly one CONNECT this core serves, and nothing after it
    Lock(LockConnect<'a>),
}

/// protocol/_identity.py's rule: 1-64 of A-Z a-z 0-9 . _ -, the first a letter or digit.
pub fn valid_identity(name: &[u8]) -> bool {
    !name.is_empty()
        && name.len() <= MAX_SN
        && name[0].is_ascii_alphanumeric()
        && name.iter().all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
}

/// The bytes `f` (all a socket sent so far) as the CONNECT of a lock this core serves.
pub fn lock_connect(f: &[u8], max_frame: isize) -> Connect<'_> {
    let len = match check_header(f, max_frame) {
        Check::Partial => return Connect::Partial,
        Check::Stop => return Connect::Other,
        Check::Take(len) => len,
    };
    if len != f.len() {
        return Connect::Other; // (bytes behind the CONNECT: the Python session's)
    }
    let v = view_frame(f, len);
    if v.opcode != OP_CONNECT || v.flags != 0 || !valid_identity(v.sn) {
        return Connect::Other;
    }
    // role u8 | keepalive_s u16 | proto_max u8 | client str8 [| max_frame u32]
    let b = v.body;
    if b.len() < 5 || b[0] != ROLE_LOCK {
        return Connect::Other;
    }
    let cl = b[4] as usize;
    let max_frame = if b.len() == 5 + cl {
        0
    } else if b.len() == 9 + cl {
        be32(&b[5 + cl..])
    } else {
        return Connect::Other;
    };
    if std::str::from_utf8(&b[5..5 + cl]).is_err() {
        return Connect::Other;
    }
    Connect::Lock(LockConnect { sn: v.sn, opaque: v.opaque, body: b, max_frame })
}

/// CHALLENGE's body: nonce | server_time_ms u64 | methods u8 [| broker_id str8].
pub fn challenge_body(nonce: &[u8; NONCE_SIZE], server_time_ms: u64, broker_id: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(NONCE_SIZE + 10 + broker_id.len());
    out.extend_from_slice(nonce);
    out.extend_from_slice(&server_time_ms.to_be_bytes());
    out.push(CHALLENGE_METHODS);
    if !broker_id.is_empty() {
        out.push(broker_id.len() as u8);
        out.extend_from_slice(broker_id);
    }
    out
}

/// The session transcript (protocol/_auth.py transcript_hash).
pub fn transcript(sn: &[u8], connect_flags: u8, connect_body: &[u8], challenge_body: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(TRANSCRIPT_DOMAIN);
    h.update([VERSION, connect_flags, sn.len() as u8]);
    h.update(sn);
    h.update((connect_body.len() as u16).to_be_bytes());
    h.update(connect_body);
    h.update((challenge_body.len() as u16).to_be_bytes());
    h.update(challenge_body);
    h.finalize().into()
}

/// The CHALLENGE frame answering `c`, and the body it carries.
pub fn challenge_frame(c: &LockConnect<'_>, nonce: &[u8; NONCE_SIZE], server_time_ms: u64, broker_id: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let body = challenge_body(nonce, server_time_ms, broker_id);
    (frame::encode(OP_CHALLENGE, b"", FLAG_RESPONSE, c.opaque, &body), body)
}

/// (a broker_id longer than a str8 cannot be sent: the ingest refuses it at start)
pub fn broker_id_fits(broker_id: &[u8]) -> bool {
    broker_id.len() <= 255
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connect(sn: &[u8], flags: u8, body: &[u8], opaque: u32) -> Vec<u8> {
        frame::encode(OP_CONNECT, sn, flags, opaque, body)
    }

    const BODY: &[u8] = &[1, 0, 30, 1, 2, b'f', b'w', 0, 0, 16, 0];

    #[test]
    fn serves_a_lock_connect() {
        let f = connect(b"LOCK-1", 0, BODY, 7);
        match lock_connect(&f, 4096) {
            Connect::Lock(c) => {
                assert_eq!((c.sn, c.opaque, c.max_frame), (&b"LOCK-1"[..], 7, 4096));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(lock_connect(&f[..f.len() - 1], 4096), Connect::Partial);
    }

    #[test]
    fn leaves_the_rest() {
        let mut twice = connect(b"LOCK-1", 0, BODY, 7);
        twice.extend_from_slice(&connect(b"LOCK-1", 0, BODY, 7));
        let mut service = BODY.to_vec();
        service[0] = ROLE_SERVICE;
        for f in [
            connect(b"LOCK-1", FLAG_MAC, BODY, 7),
            connect(b"-LOCK", 0, BODY, 7),
            connect(b"", 0, BODY, 7),
            connect(b"LOCK 1", 0, BODY, 7),
            connect(b"LOCK-1", 0, &service, 7),
            connect(b"LOCK-1", 0, &BODY[..BODY.len() - 1], 7),
            connect(b"LOCK-1", 0, &[1, 0, 30, 1, 1, 0xFF], 7),
            twice,
        ] {
            assert_eq!(lock_connect(&f, 4096), Connect::Other);
        }
        let mut bad_crc = connect(b"LOCK-1", 0, BODY, 7);
        *bad_crc.last_mut().unwrap() ^= 1;
        assert_eq!(lock_connect(&bad_crc, 4096), Connect::Other);
        assert_eq!(lock_connect(&connect(b"LOCK-1", 0, BODY, 7), 20), Connect::Other);
    }

    #[test]
    fn challenge_layout() {
        let f = connect(b"LOCK-1", 0, BODY, 9);
        let Connect::Lock(c) = lock_connect(&f, 4096) else { panic!() };
        let (frame, body) = challenge_frame(&c, &[7; NONCE_SIZE], 1234, b"");
        assert_eq!(frame.len(), MIN_FRAME + NONCE_SIZE + 9);
        assert_eq!(check_header(&frame, 4096), Check::Take(frame.len()));
        let v = view_frame(&frame, frame.len());
        assert_eq!((v.opcode, v.flags, v.opaque, v.body), (OP_CHALLENGE, FLAG_RESPONSE, 9, &body[..]));
        let (with_id, _) = challenge_frame(&c, &[7; NONCE_SIZE], 1234, b"gw-1");
        assert_eq!(with_id.len(), frame.len() + 5);
    }
}
