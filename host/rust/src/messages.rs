//! The consumer's MESSAGES body (SPEC 4, protocol/_consume.py): sub_id u32, count u16,
//! then per message queue_offset u64, delivery u16, seq u32, lock_ts_ms u64,
//! broker_ts_us u64, sn str8, topic str8, headers (u16 length), payload (u32 length).

use crate::bytes::{be16, be32, be64};
use crate::consts::MSG_FIXED;

/// One message of a body, pointing into it.
pub struct MessageView<'a> {
    pub queue_offset: u64,
    pub delivery: u16,
    pub seq: u32,
    pub lock_ts_ms: u64,
    pub broker_ts_us: u64,
    pub sn: &'a [u8],
    pub topic: &'a [u8],
    pub headers: &'a [u8],
    pub payload: &'a [u8],
}

/// The body's sub_id and messages; None for any body the Python decoder refuses
/// (truncated, trailing bytes): its BadBody then says why.
pub fn parse_messages(b: &[u8]) -> Option<(u32, Vec<MessageView<'_>>)> {
    if b.len() < 6 {
        return None;
    }
    let sub_id = be32(b);
    let count = be16(&b[4..]) as usize;
    // each message takes at least MSG_FIXED + 8 bytes: a count the body cannot hold
    // is refused before a list of that size is made
    if count * (MSG_FIXED + 8) > b.len() - 6 {
        return None;
    }
    let mut out = Vec::with_capacity(count);
    let mut pos = 6;
    for _ in 0..count {
        let m = b.get(pos..pos + MSG_FIXED + 1)?;
        let mut at = pos + MSG_FIXED;
        let sn_len = b[at] as usize;
        let sn = b.get(at + 1..at + 1 + sn_len)?;
        at += 1 + sn_len;
        let tp_len = *b.get(at)? as usize;
        let topic = b.get(at + 1..at + 1 + tp_len)?;
        at += 1 + tp_len;
        let h_len = be16(b.get(at..at + 2)?) as usize;
        let headers = b.get(at + 2..at + 2 + h_len)?;
        at += 2 + h_len;
        let p_len = be32(b.get(at..at + 4)?) as usize;
        let payload = b.get(at + 4..at + 4 + p_len)?;
        pos = at + 4 + p_len;
        out.push(MessageView {
            queue_offset: be64(m),
            delivery: be16(&m[8..]),
            seq: be32(&m[10..]),
            lock_ts_ms: be64(&m[14..]),
            broker_ts_us: be64(&m[22..]),
            sn,
            topic,
            headers,
            payload,
        });
    }
    if pos != b.len() {
        return None;
    }
    Some((sub_id, out))
}

/// One lease's entry to write (no headers: those go through the Python encoder).
pub struct LeaseFields<'a> {
    pub wire: u64,
    pub delivery: u16,
    pub seq: u32,
    pub lock_ts_ms: u64,
    pub broker_ts_us: u64,
    pub sn: &'a [u8],
    pub topic: &'a [u8],
    pub payload: &'a [u8],
}

pub fn lease_size(v: &LeaseFields<'_>) -> usize {
    MSG_FIXED + 2 + v.sn.len() + v.topic.len() + 2 + 4 + v.payload.len()
}

/// The MESSAGES body of `leases` (at most 65535) into `w` (6 + their sizes bytes).
pub fn put_messages(w: &mut [u8], sub_id: u32, leases: &[LeaseFields<'_>]) {
    w[0..4].copy_from_slice(&sub_id.to_be_bytes());
    w[4..6].copy_from_slice(&(leases.len() as u16).to_be_bytes());
    let mut at = 6;
    for v in leases {
        let w = &mut w[at..at + lease_size(v)];
        w[0..8].copy_from_slice(&v.wire.to_be_bytes());
        w[8..10].copy_from_slice(&v.delivery.to_be_bytes());
        w[10..14].copy_from_slice(&v.seq.to_be_bytes());
        w[14..22].copy_from_slice(&v.lock_ts_ms.to_be_bytes());
        w[22..30].copy_from_slice(&v.broker_ts_us.to_be_bytes());
        let mut p = MSG_FIXED;
        for s in [v.sn, v.topic] {
            w[p] = s.len() as u8;
            w[p + 1..p + 1 + s.len()].copy_from_slice(s);
            p += 1 + s.len();
        }
        w[p..p + 2].copy_from_slice(&[0, 0]); // no headers
        w[p + 2..p + 6].copy_from_slice(&(v.payload.len() as u32).to_be_bytes());
        w[p + 6..].copy_from_slice(v.payload);
        at += lease_size(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_written_reads_back_and_every_cut_is_refused() {
        let l = [
            LeaseFields {
                wire: 1,
                delivery: 2,
                seq: 3,
                lock_ts_ms: 4,
                broker_ts_us: 5,
                sn: b"S",
                topic: b"t",
                payload: b"pp",
            },
            LeaseFields {
                wire: u64::MAX,
                delivery: 0,
                seq: 9,
                lock_ts_ms: 0,
                broker_ts_us: 1,
                sn: b"",
                topic: b"",
                payload: b"",
            },
        ];
        let mut w = vec![0u8; 6 + l.iter().map(lease_size).sum::<usize>()];
        put_messages(&mut w, 77, &l);
        let (sub, rows) = parse_messages(&w).unwrap();
        assert_eq!((sub, rows.len(), rows[0].payload, rows[1].queue_offset), (77, 2, &b"pp"[..], u64::MAX));
        for n in 0..w.len() {
            assert!(parse_messages(&w[..n]).is_none());
        }
        let mut longer = w.clone();
        longer.push(0);
        assert!(parse_messages(&longer).is_none());
    }
}
