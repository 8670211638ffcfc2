//! Frames (protocol/SPEC.md 1): the checks the Python decoder and session make, in
//! the decoder's order, for the frames this core takes, and the PUBLISH_ACK it writes.
//! Whatever it does not take is left to the Python decoder, which raises the
//! protocol's own errors, so error behaviour cannot drift.

use crate::bytes::{be16, be32, be64};
use crate::checksum::crc16;
use crate::consts::*;
use crate::mac::{MacKey, TagHead};

/// What the bytes at a frame's start say.
#[derive(Debug, PartialEq, Eq)]
pub enum Check {
    /// anything this core does not take: the Python path's
    Stop,
    /// no bad header yet, not whole yet
    Partial,
    /// a whole frame of this many bytes
    Take(usize),
}

/// The header checks of the frame at `f[0]` (all of `f` is available): `Take(length)`
/// for a whole frame with a good version, length and CRC.
#[inline]
pub fn check_header(f: &[u8], max_frame: isize) -> Check {
    if f.len() < HEADER_SIZE {
        return Check::Partial;
    }
    let sn_len = f[7] as usize;
    let len = be32(&f[1..5]) as usize;
    if f[0] != VERSION || sn_len > MAX_SN || len < MIN_FRAME + sn_len || len as isize > max_frame {
        return Check::Stop;
    }
    if len > f.len() {
        return Check::Partial;
    }
    if crc16(&f[..len - CRC_SIZE], 0xFFFF) != be16(&f[len - CRC_SIZE..len]) {
        return Check::Stop;
    }
    Check::Take(len)
}

/// A PUBLISH this core may take under the session's SN `sn` with its MAC flag `mac`
/// (0 or FLAG_MAC). A sealed frame's tag is [`check_sealed_publish`]'s to check.
#[inline]
pub fn check_publish_as(f: &[u8], max_frame: isize, sn: &[u8], mac: u8) -> Check {
    let len = match check_header(f, max_frame) {
        Check::Take(len) => len,
        other => return other,
    };
    let sn_len = f[7] as usize;
    if be16(&f[5..7]) != OP_PUBLISH || f[HEADER_SIZE + sn_len] & FLAG_MAC != mac {
        return Check::Stop; // another request, or MACs not as the session has them
    }
    if sn_len != 0 && &f[HEADER_SIZE..HEADER_SIZE + sn_len] != sn {
        return Check::Stop; // a producer id other than the session's: the session decides
    }
    Check::Take(len)
}

/// [`check_publish_as`] for a PUBLISH sealed with a frame MAC: `Take` only when its
/// tag is the one the session's `rx`-th frame to the broker must carry.
pub fn check_sealed_publish(f: &[u8], max_frame: isize, sn: &[u8], key: &MacKey, rx: u32) -> Check {
    let len = match check_publish_as(f, max_frame, sn, FLAG_MAC) {
        Check::Take(len) => len,
        other => return other,
    };
    let sn_len = f[7] as usize;
    let body_at = HEADER_SIZE + sn_len + SUBHEADER_SIZE;
    let body = &f[body_at..len - CRC_SIZE];
    if body.len() < TAG_SIZE {
        return Check::Stop;
    }
    let (plain, tag) = body.split_at(body.len() - TAG_SIZE);
    let head = TagHead {
        direction: TO_BROKER,
        counter: rx,
        opcode: OP_PUBLISH,
        flags: f[HEADER_SIZE + sn_len],
        opaque: be32(&f[HEADER_SIZE + sn_len + 1..]),
        sn: &f[HEADER_SIZE..HEADER_SIZE + sn_len],
    };
    if !key.verify(&head, plain, tag) {
        return Check::Stop;
    }
    Check::Take(len)
}

/// The fields of a whole PUBLISH (Publish in SPEC.md: topic str8, seq u32,
/// lock_ts_ms u64, payload), pointing into the frame.
pub struct PublishView<'a> {
    pub flags: u8,
    pub opaque: u32,
    pub topic: &'a [u8],
    pub seq: u32,
    pub lock_ts_ms: u64,
    pub payload: &'a [u8],
}

/// The fields of the PUBLISH `f[..length]` ([`check_publish_as`] took it; `length`
/// without a sealed frame's tag); None when the body is truncated (BadBody in Python).
pub fn view_publish(f: &[u8], length: usize) -> Option<PublishView<'_>> {
    let sn_len = f[7] as usize;
    let body_at = HEADER_SIZE + sn_len + SUBHEADER_SIZE;
    let body = f.get(body_at..length.checked_sub(CRC_SIZE)?)?;
    let tlen = *body.first().unwrap_or(&0) as usize;
    if body.len() < 13 + tlen {
        return None;
    }
    Some(PublishView {
        flags: f[HEADER_SIZE + sn_len],
        opaque: be32(&f[HEADER_SIZE + sn_len + 1..]),
        topic: &body[1..1 + tlen],
        seq: be32(&body[1 + tlen..]),
        lock_ts_ms: be64(&body[5 + tlen..]),
        payload: &body[13 + tlen..],
    })
}

/// One whole frame's header fields ([`check_header`] took it).
pub struct FrameView<'a> {
    pub opcode: u16,
    pub sn: &'a [u8],
    pub flags: u8,
    pub opaque: u32,
    pub body: &'a [u8],
}

pub fn view_frame(f: &[u8], length: usize) -> FrameView<'_> {
    let sn_len = f[7] as usize;
    let body_at = HEADER_SIZE + sn_len + SUBHEADER_SIZE;
    FrameView {
        opcode: be16(&f[5..7]),
        sn: &f[HEADER_SIZE..HEADER_SIZE + sn_len],
        flags: f[HEADER_SIZE + sn_len],
        opaque: be32(&f[HEADER_SIZE + sn_len + 1..]),
        body: &f[body_at..length - CRC_SIZE],
    }
}

/// The PUBLISH_ACK of one stored record into `f` (ACK_FRAME_LEN bytes, no SN), or
/// with `key` a sealed one (SEALED_ACK_LEN bytes) for the broker's `counter`-th frame.
pub fn put_publish_ack(f: &mut [u8], opaque: u32, dup: bool, offset: i64, seal: Option<(&MacKey, u32)>) {
    let size = if seal.is_some() { SEALED_ACK_LEN } else { ACK_FRAME_LEN };
    let flags = if seal.is_some() { FLAG_RESPONSE | FLAG_MAC } else { FLAG_RESPONSE };
    f[0] = VERSION;
    f[1..5].copy_from_slice(&(size as u32).to_be_bytes());
    f[5..7].copy_from_slice(&OP_PUBLISH_ACK.to_be_bytes());
    f[7] = 0;
    f[8] = flags;
    f[9..13].copy_from_slice(&opaque.to_be_bytes());
    f[13] = if dup { ACK_DUPLICATE } else { ACK_STORED };
    f[14..22].copy_from_slice(&(offset.max(0) as u64).to_be_bytes());
    if let Some((key, counter)) = seal {
        let head = TagHead { direction: TO_CLIENT, counter, opcode: OP_PUBLISH_ACK, flags, opaque, sn: b"" };
        let tag = key.tag(&head, &f[13..22]);
        f[22..22 + TAG_SIZE].copy_from_slice(&tag);
    }
    let c = crc16(&f[..size - CRC_SIZE], 0xFFFF);
    f[size - CRC_SIZE..size].copy_from_slice(&c.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(opcode: u16, sn: &[u8], flags: u8, opaque: u32, body: &[u8]) -> Vec<u8> {
        let len = MIN_FRAME + sn.len() + body.len();
        let mut f = vec![VERSION];
        f.extend_from_slice(&(len as u32).to_be_bytes());
        f.extend_from_slice(&opcode.to_be_bytes());
        f.push(sn.len() as u8);
        f.extend_from_slice(sn);
        f.push(flags);
        f.extend_from_slice(&opaque.to_be_bytes());
        f.extend_from_slice(body);
        let c = crc16(&f, 0xFFFF);
        f.extend_from_slice(&c.to_be_bytes());
        f
    }

    fn publish_body(topic: &[u8], seq: u32, ts: u64, payload: &[u8]) -> Vec<u8> {
        let mut b = vec![topic.len() as u8];
        b.extend_from_slice(topic);
        b.extend_from_slice(&seq.to_be_bytes());
        b.extend_from_slice(&ts.to_be_bytes());
        b.extend_from_slice(payload);
        b
    }

    #[test]
    fn a_publish_is_taken_and_viewed() {
        let f = frame(OP_PUBLISH, b"LOCK", 0, 7, &publish_body(b"t", 3, 9, b"pay"));
        assert_eq!(check_publish_as(&f, 1 << 20, b"LOCK", 0), Check::Take(f.len()));
        let v = view_publish(&f, f.len()).unwrap();
        assert_eq!((v.opaque, v.topic, v.seq, v.lock_ts_ms, v.payload), (7, &b"t"[..], 3, 9, &b"pay"[..]));
        // every prefix is partial, never taken; another SN stops
        for n in 0..f.len() {
            assert_eq!(check_publish_as(&f[..n], 1 << 20, b"LOCK", 0), Check::Partial);
        }
        assert_eq!(check_publish_as(&f, 1 << 20, b"OTHER", 0), Check::Stop);
        assert_eq!(check_publish_as(&f, 10, b"LOCK", 0), Check::Stop);
    }

    #[test]
    fn any_damaged_byte_stops_or_waits() {
        let f = frame(OP_PUBLISH, b"", 0, 1, &publish_body(b"topic", 1, 2, b"x"));
        for i in 0..f.len() {
            for bit in 0..8 {
                let mut g = f.clone();
                g[i] ^= 1 << bit;
                assert_ne!(check_publish_as(&g, 1 << 20, b"", 0), Check::Take(f.len()), "byte {i}");
            }
        }
    }

    #[test]
    fn a_truncated_body_is_not_viewed() {
        let f = frame(OP_PUBLISH, b"", 0, 1, &[5, b'a']);
        assert_eq!(check_publish_as(&f, 1 << 20, b"", 0), Check::Take(f.len()));
        assert!(view_publish(&f, f.len()).is_none());
    }

    #[test]
    fn a_sealed_publish_checks_its_tag() {
        let key = MacKey::new(b"k");
        let body = publish_body(b"t", 1, 2, b"p");
        let head =
            TagHead { direction: TO_BROKER, counter: 4, opcode: OP_PUBLISH, flags: FLAG_MAC, opaque: 3, sn: b"" };
        let mut sealed = body.clone();
        sealed.extend_from_slice(&key.tag(&head, &body));
        let f = frame(OP_PUBLISH, b"", FLAG_MAC, 3, &sealed);
        assert_eq!(check_sealed_publish(&f, 1 << 20, b"", &key, 4), Check::Take(f.len()));
        assert_eq!(check_sealed_publish(&f, 1 << 20, b"", &key, 5), Check::Stop);
    }

    #[test]
    fn an_ack_is_a_valid_frame() {
        let mut f = [0u8; ACK_FRAME_LEN];
        put_publish_ack(&mut f, 9, true, 77, None);
        assert_eq!(check_header(&f, 1 << 20), Check::Take(ACK_FRAME_LEN));
        let v = view_frame(&f, f.len());
        assert_eq!((v.opcode, v.flags, v.opaque, v.body[0]), (OP_PUBLISH_ACK, FLAG_RESPONSE, 9, 1));
    }
}
