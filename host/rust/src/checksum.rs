//! The two checksums, from their crates: CRC-16/CCITT-FALSE (every frame; `crc`'s
//! CRC_16_IBM_3740, slice-by-16 tables) and zlib's CRC-32 (every commit-log record;
//! `crc32fast`, with the CPU's carry-less multiply where it has it).

use crc::{Crc, Table, CRC_16_IBM_3740};

/// CRC-16/CCITT-FALSE: poly 0x1021, init 0xFFFF, no reflection, xorout 0 (SPEC 1).
static CRC16: Crc<u16, Table<16>> = Crc::<u16, Table<16>>::new(&CRC_16_IBM_3740);

/// The CRC-16 of `data` continued from `crc` (0xFFFF: a frame's own).
#[inline]
pub fn crc16(data: &[u8], crc: u16) -> u16 {
    let mut d = CRC16.digest_with_initial(crc);
    d.update(data);
    d.finalize()
}

/// zlib's CRC-32 of `data` continued from `crc` (0: a record's own), as `zlib.crc32`.
#[inline]
pub fn crc32(data: &[u8], crc: u32) -> u32 {
    let mut h = crc32fast::Hasher::new_with_initial(crc);
    h.update(data);
    h.finalize()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_check_value_and_the_protocols_vectors() {
        // the catalogue's check value, and protocol/vectors.json's empty frame CRC
        assert_eq!(crc16(b"123456789", 0xFFFF), 0x29B1);
        assert_eq!(crc16(b"", 0xFFFF), 0xFFFF);
        // continuing is the same as one pass
        assert_eq!(crc16(b"56789", crc16(b"1234", 0xFFFF)), 0x29B1);
    }

    #[test]
    fn crc32_is_zlibs() {
        assert_eq!(crc32(b"123456789", 0), 0xCBF4_3926);
        assert_eq!(crc32(b"56789", crc32(b"1234", 0)), 0xCBF4_3926);
        assert_eq!(crc32(b"", 0), 0);
    }
}
