//! Big- and little-endian field readers and writers over checked slices.

#[inline]
pub fn be16(p: &[u8]) -> u16 {
    u16::from_be_bytes([p[0], p[1]])
}
#[inline]
pub fn be32(p: &[u8]) -> u32 {
    u32::from_be_bytes(p[..4].try_into().unwrap())
}
#[inline]
pub fn be64(p: &[u8]) -> u64 {
    u64::from_be_bytes(p[..8].try_into().unwrap())
}
#[inline]
pub fn le16(p: &[u8]) -> u16 {
    u16::from_le_bytes([p[0], p[1]])
}
#[inline]
pub fn le32(p: &[u8]) -> u32 {
    u32::from_le_bytes(p[..4].try_into().unwrap())
}
#[inline]
pub fn le64(p: &[u8]) -> u64 {
    u64::from_le_bytes(p[..8].try_into().unwrap())
}
