//! The wire's and the commit log's layout constants. `lockmq._core.CONSTANTS` exports
//! them, and `tests/protocol/test_core_constants.py` holds each equal to its Python
//! source (protocol/_constants.py, store/records.py, protocol/_mac.py), so a change
//! there that is not made here fails the suite.

// protocol/_constants.py
pub const VERSION: u8 = 1;
/// version u8, length u32, opcode u16, sn_len u8
pub const HEADER_SIZE: usize = 8;
/// flags u8, opaque u32
pub const SUBHEADER_SIZE: usize = 5;
pub const CRC_SIZE: usize = 2;
pub const MIN_FRAME: usize = HEADER_SIZE + SUBHEADER_SIZE + CRC_SIZE;
pub const MAX_SN: usize = 64;
pub const OP_PUBLISH: u16 = 0x10;
pub const OP_PUBLISH_ACK: u16 = 0x11;
pub const FLAG_ONEWAY: u8 = 0x01;
pub const FLAG_RESPONSE: u8 = 0x02;
pub const FLAG_MAC: u8 = 0x04;
// protocol/_bodies.py PublishAck
pub const ACK_STORED: u8 = 0;
pub const ACK_DUPLICATE: u8 = 1;
/// a PUBLISH_ACK with no SN: header, subheader, status u8, offset u64, crc
pub const ACK_FRAME_LEN: usize = MIN_FRAME + 9;

// protocol/_mac.py
pub const TAG_SIZE: usize = 16;
/// the direction byte of a frame the lock sends (and of one the broker sends)
pub const TO_BROKER: u8 = 0;
pub const TO_CLIENT: u8 = 1;
pub const SEALED_ACK_LEN: usize = ACK_FRAME_LEN + TAG_SIZE;

// protocol/_consume.py: queue_offset u64, delivery u16, seq u32, lock_ts_ms u64, broker_ts_us u64
pub const MSG_FIXED: usize = 30;

// host/lockmq/store/records.py
pub const RECORD_HEADER: usize = 40;
pub const FORMAT_VERSION: u8 = 1;
pub const FLAG_SYSTEM: u8 = 0x01;
pub const MAX_SN_LEN: usize = 255;
pub const MAX_SEQ: u64 = 0xFFFF_FFFF;

/// Every constant above by the name its Python source gives it.
pub const ALL: &[(&str, u64)] = &[
    ("VERSION", VERSION as u64),
    ("HEADER_SIZE", HEADER_SIZE as u64),
    ("SUBHEADER_SIZE", SUBHEADER_SIZE as u64),
    ("CRC_SIZE", CRC_SIZE as u64),
    ("MIN_FRAME", MIN_FRAME as u64),
    ("MAX_SN", MAX_SN as u64),
    ("Op.PUBLISH", OP_PUBLISH as u64),
    ("Op.PUBLISH_ACK", OP_PUBLISH_ACK as u64),
    ("Flag.ONEWAY", FLAG_ONEWAY as u64),
    ("Flag.RESPONSE", FLAG_RESPONSE as u64),
    ("Flag.MAC", FLAG_MAC as u64),
    ("PublishAck.STORED", ACK_STORED as u64),
    ("PublishAck.DUPLICATE", ACK_DUPLICATE as u64),
    ("TAG_SIZE", TAG_SIZE as u64),
    ("TO_BROKER", TO_BROKER as u64),
    ("TO_CLIENT", TO_CLIENT as u64),
    ("MSG_FIXED", MSG_FIXED as u64),
    ("records.HEADER_SIZE", RECORD_HEADER as u64),
    ("records.FORMAT_VERSION", FORMAT_VERSION as u64),
    ("records.FLAG_SYSTEM", FLAG_SYSTEM as u64),
    ("records.MAX_SN_LEN", MAX_SN_LEN as u64),
    ("records.MAX_SEQ", MAX_SEQ),
];
