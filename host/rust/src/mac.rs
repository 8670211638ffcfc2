//! Frame MACs (SPEC 2 "Frame MACs"): HMAC-SHA256 of the session key over the frame's
//! direction, counter, opcode, flags, opaque, SN and body, cut to 16 bytes
//! (protocol/_mac.py frame_tag is the reference). RustCrypto's `hmac` and `sha2`;
//! `sha2` picks the CPU's SHA extensions at run time.

use crate::consts::TAG_SIZE;
use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// A session key with its two HMAC pads hashed once: each tag then clones the keyed
/// state instead of hashing the pads again.
#[derive(Clone)]
pub struct MacKey(HmacSha256);

/// The fields a tag covers besides the body.
pub struct TagHead<'a> {
    pub direction: u8,
    pub counter: u32,
    pub opcode: u16,
    pub flags: u8,
    pub opaque: u32,
    pub sn: &'a [u8],
}

impl MacKey {
    pub fn new(key: &[u8]) -> MacKey {
        MacKey(HmacSha256::new_from_slice(key).expect("HMAC takes a key of any length"))
    }

    fn keyed(&self, h: &TagHead<'_>, body: &[u8]) -> HmacSha256 {
        debug_assert!(h.sn.len() <= 255);
        let mut head = [0u8; 13];
        head[0] = h.direction;
        head[1..5].copy_from_slice(&h.counter.to_be_bytes());
        head[5..7].copy_from_slice(&h.opcode.to_be_bytes());
        head[7] = h.flags;
        head[8..12].copy_from_slice(&h.opaque.to_be_bytes());
        head[12] = h.sn.len() as u8;
        let mut m = self.0.clone();
        m.update(&head);
        m.update(h.sn);
        m.update(body);
        m
    }

    /// The tag of a frame with these fields and `body` (the body without its tag).
    pub fn tag(&self, h: &TagHead<'_>, body: &[u8]) -> [u8; TAG_SIZE] {
        let full = self.keyed(h, body).finalize().into_bytes();
        let mut out = [0u8; TAG_SIZE];
        out.copy_from_slice(&full[..TAG_SIZE]);
        out
    }

    /// Is `tag` the one such a frame must carry? (In constant time, as compare_digest.)
    pub fn verify(&self, h: &TagHead<'_>, body: &[u8], tag: &[u8]) -> bool {
        tag.len() == TAG_SIZE && self.keyed(h, body).verify_truncated_left(tag).is_ok()
    }
}

/// HMAC-SHA256 of `msg` under `key`, whole (the device proof and the session key:
/// lockmq/security/keys.py hmac_sha256, the standard library's, is the reference).
pub fn hmac_sha256(key: &[u8], msg: &[u8]) -> [u8; 32] {
    let mut m = HmacSha256::new_from_slice(key).expect("HMAC takes a key of any length");
    m.update(msg);
    m.finalize().into_bytes().into()
}

/// Which SHA-256 compression `sha2` runs on this CPU (for `lockmq --version`).
pub fn sha256_impl() -> &'static str {
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    {
        cpufeatures::new!(shani, "sha", "sse2", "ssse3", "sse4.1");
        if shani::get() {
            return "sha-ni";
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        cpufeatures::new!(armsha, "sha2");
        if armsha::get() {
            return "armv8-sha2";
        }
    }
    "portable"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc4231_case_2_cut_to_16() {
        let k = MacKey(HmacSha256::new_from_slice(b"Jefe").unwrap());
        let mut m = k.0.clone();
        m.update(b"what do ya want for nothing?");
        let full = m.finalize().into_bytes();
        assert_eq!(hex(&full[..16]), "5bdcc146bf60754e6a042426089575c7");
    }

    #[test]
    fn rfc4231_cases_2_and_6_whole() {
        assert_eq!(
            hex(&hmac_sha256(b"Jefe", b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // a key longer than the block: hashed first
        assert_eq!(
            hex(&hmac_sha256(&[0xaa; 131], b"Test Using Larger Than Block-Size Key - Hash Key First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn a_tag_verifies_and_a_changed_one_does_not() {
        let k = MacKey::new(&[7u8; 32]);
        let h = TagHead { direction: 0, counter: 5, opcode: 0x10, flags: 4, opaque: 9, sn: b"L" };
        let t = k.tag(&h, b"body");
        assert!(k.verify(&h, b"body", &t));
        let mut bad = t;
        bad[15] ^= 1;
        assert!(!k.verify(&h, b"body", &bad));
        assert!(!k.verify(&h, b"bodz", &t));
    }
}
