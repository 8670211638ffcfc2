//! Commit-log records (host/lockmq/store/FORMAT.md): `<IIBBHBBHIIQQ` -- length, crc,
//! format, flags, topic_len, sn_len, reserved, headers_len, seq, payload_len,
//! lock_ts_ms, broker_ts_us -- then topic, SN, headers, payload; the CRC-32 covers
//! everything after it. store/records.py is the reference.

use crate::bytes::{le16, le32, le64};
use crate::checksum::crc32;
use crate::consts::*;

/// The fields of one record to write.
pub struct NewFields<'a> {
    pub flags: u8,
    pub topic: &'a [u8],
    pub sn: &'a [u8],
    pub seq: u32,
    pub lock_ts_ms: u64,
    pub broker_ts_us: u64,
    pub payload: &'a [u8],
}

pub fn record_size(r: &NewFields<'_>) -> usize {
    RECORD_HEADER + r.topic.len() + r.sn.len() + r.payload.len()
}

/// Write `r` into `o` (exactly [`record_size`] bytes), CRC last.
pub fn put_record(o: &mut [u8], r: &NewFields<'_>) {
    let size = o.len();
    let (tl, sl) = (r.topic.len(), r.sn.len());
    o[0..4].copy_from_slice(&((size - 4) as u32).to_le_bytes());
    o[8] = FORMAT_VERSION;
    o[9] = r.flags;
    o[10..12].copy_from_slice(&(tl as u16).to_le_bytes());
    o[12] = sl as u8;
    o[13] = 0;
    o[14..16].copy_from_slice(&0u16.to_le_bytes());
    o[16..20].copy_from_slice(&r.seq.to_le_bytes());
    o[20..24].copy_from_slice(&(r.payload.len() as u32).to_le_bytes());
    o[24..32].copy_from_slice(&r.lock_ts_ms.to_le_bytes());
    o[32..40].copy_from_slice(&r.broker_ts_us.to_le_bytes());
    o[RECORD_HEADER..RECORD_HEADER + tl].copy_from_slice(r.topic);
    o[RECORD_HEADER + tl..RECORD_HEADER + tl + sl].copy_from_slice(r.sn);
    o[RECORD_HEADER + tl + sl..].copy_from_slice(r.payload);
    let c = crc32(&o[8..], 0);
    o[4..8].copy_from_slice(&c.to_le_bytes());
}

/// A record read back, pointing into the read.
pub struct RecordView<'a> {
    pub sn: &'a [u8],
    pub seq: u32,
    pub lock_ts_ms: u64,
    pub broker_ts_us: u64,
    pub payload: &'a [u8],
}

/// The record at `r[0]` (all of `r` is the read from there) when it is whole, of this
/// format, its CRC-32 good, of topic `topic` and without headers; None for anything
/// else, which decode_record reads and names (CorruptRecord).
pub fn view_record<'a>(r: &'a [u8], topic: &[u8]) -> Option<RecordView<'a>> {
    if r.len() < RECORD_HEADER {
        return None;
    }
    let length = le32(r) as usize;
    let crc = le32(&r[4..]);
    let (fmt, tlen, slen, hlen) = (r[8], le16(&r[10..]) as usize, r[12] as usize, le16(&r[14..]) as usize);
    let plen = le32(&r[20..]) as usize;
    if length < RECORD_HEADER - 4
        || length > r.len() - 4
        || fmt != FORMAT_VERSION
        || RECORD_HEADER as u64 + tlen as u64 + slen as u64 + hlen as u64 + plen as u64 != length as u64 + 4
        || crc32(&r[8..length + 4], 0) != crc
        || hlen != 0
        || tlen != topic.len()
        || &r[RECORD_HEADER..RECORD_HEADER + tlen] != topic
    {
        return None;
    }
    let at = RECORD_HEADER + tlen;
    Some(RecordView {
        sn: &r[at..at + slen],
        seq: le32(&r[16..]),
        lock_ts_ms: le64(&r[24..]),
        broker_ts_us: le64(&r[32..]),
        payload: &r[at + slen..at + slen + plen],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_and_any_damage_is_refused() {
        let f = NewFields {
            flags: 0,
            topic: b"door",
            sn: b"LOCK-1",
            seq: 5,
            lock_ts_ms: 6,
            broker_ts_us: 7,
            payload: b"xyz",
        };
        let mut o = vec![0u8; record_size(&f)];
        put_record(&mut o, &f);
        let v = view_record(&o, b"door").unwrap();
        assert_eq!((v.sn, v.seq, v.lock_ts_ms, v.broker_ts_us, v.payload), (&b"LOCK-1"[..], 5, 6, 7, &b"xyz"[..]));
        assert!(view_record(&o, b"dooR").is_none());
        for i in 0..o.len() {
            let mut g = o.clone();
            g[i] ^= 0x10;
            assert!(view_record(&g, b"door").is_none(), "byte {i}");
            assert!(view_record(&o[..i], b"door").is_none());
        }
    }
}
