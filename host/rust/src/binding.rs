//! The Python binding: `lockmq._core`. Each function is one call per read, batch or
//! commit of the Python code it mirrors (named in its doc); its arguments and results
//! are that code's. Anything a function does not take whole it leaves to the Python
//! path (None, or the index where it stopped), so error behaviour stays Python's.
//!
//! `unsafe` is confined to a few helpers, each with the checks that make it sound: a
//! buffer's bytes (`Bytes`), a tuple subclass filled in place (`tuple_of_type`), a slots
//! class's instance made without its `__init__` (`record_layout`, `new_record`), the
//! writer's fd borrowed for pwrite/fdatasync (`commit_write`); and the lane's system
//! calls (lane.rs).

use std::fs::File;
use std::mem::ManuallyDrop;
use std::os::fd::FromRawFd;
use std::os::unix::fs::FileExt;
use std::sync::Mutex;

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyOSError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyInt, PyList, PySet, PyString, PyTuple, PyType};

use crate::checksum;
use crate::consts::*;
use crate::frame::{self, Check};
use crate::mac::{self, MacKey, TagHead};
use crate::messages;
use crate::records;

// ------------------------------------------------------------------ helpers

/// The bytes of a bytes-like argument (bytes, bytearray, memoryview), as C's `y*`.
enum Bytes<'py> {
    Bytes(Bound<'py, PyBytes>),
    Buffer(PyBuffer<u8>),
}

impl<'py> Bytes<'py> {
    fn of(obj: &Bound<'py, PyAny>) -> PyResult<Self> {
        if let Ok(b) = obj.downcast::<PyBytes>() {
            return Ok(Bytes::Bytes(b.clone()));
        }
        let buf = PyBuffer::<u8>::get(obj)?;
        if !buf.is_c_contiguous() {
            return Err(PyTypeError::new_err("a contiguous bytes-like object is required"));
        }
        Ok(Bytes::Buffer(buf))
    }

    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Bytes(b) => b.as_bytes(),
            // SAFETY: the buffer is held (and so its exporter pinned: a bytearray cannot
            // be resized) for as long as the slice borrows `self`; it is C-contiguous and
            // `len_bytes` long. Its contents are only read, under the GIL or (commit_write)
            // while the caller's thread waits for this call.
            Bytes::Buffer(b) => unsafe { std::slice::from_raw_parts(b.buf_ptr() as *const u8, b.len_bytes()) },
        }
    }
}

impl<'py> FromPyObject<'py> for Bytes<'py> {
    fn extract_bound(obj: &Bound<'py, PyAny>) -> PyResult<Self> {
        Bytes::of(obj)
    }
}

/// Is `tp` a tuple subclass without a `__dict__` (a NamedTuple), which
/// [`tuple_of_type`] may fill in place?
fn check_tuple_type(tp: &Bound<'_, PyType>) -> PyResult<()> {
    // SAFETY: reading two fields of a live type object.
    let ok = unsafe {
        let t = tp.as_type_ptr();
        ffi::PyType_IsSubtype(t, std::ptr::addr_of_mut!(ffi::PyTuple_Type)) != 0 && (*t).tp_dictoffset == 0
    };
    if ok {
        Ok(())
    } else {
        Err(PyTypeError::new_err("must be a tuple type without a dict"))
    }
}

/// `tp(*items)` for a type [`check_tuple_type`] passed, filled in place (its items
/// are all a NamedTuple has), without running its `__new__`.
fn tuple_of_type<'py, const N: usize>(
    tp: &Bound<'py, PyType>,
    items: [Bound<'py, PyAny>; N],
) -> PyResult<Bound<'py, PyAny>> {
    let py = tp.py();
    // SAFETY: `tp` is a tuple subtype with no dict (checked by the caller), so its
    // tp_alloc makes a tuple of N empty items, which are each set once here.
    unsafe {
        let t = tp.as_type_ptr();
        let alloc = (*t).tp_alloc.unwrap_or(ffi::PyType_GenericAlloc);
        let obj = alloc(t, N as ffi::Py_ssize_t);
        if obj.is_null() {
            return Err(PyErr::fetch(py));
        }
        for (i, item) in items.into_iter().enumerate() {
            ffi::PyTuple_SET_ITEM(obj, i as ffi::Py_ssize_t, item.into_ptr());
        }
        Ok(Bound::from_owned_ptr(py, obj))
    }
}

/// An exact int in 0..=max, or None (not one: the Python path explains why).
fn small_uint(o: &Bound<'_, PyAny>, max: u64) -> Option<u64> {
    if !o.is_exact_instance_of::<PyInt>() {
        return None;
    }
    match o.extract::<i64>() {
        Ok(v) if v >= 0 && v as u64 <= max => Some(v as u64),
        _ => None,
    }
}

/// An exact int that fits an i64, or None.
fn exact_i64(o: &Bound<'_, PyAny>) -> Option<i64> {
    if !o.is_exact_instance_of::<PyInt>() {
        return None;
    }
    o.extract::<i64>().ok()
}

/// Two str objects equal (the same object, or exact strs with the same text).
fn same_str(a: &Bound<'_, PyAny>, b: &Bound<'_, PyAny>) -> PyResult<bool> {
    if a.is(b) {
        return Ok(true);
    }
    if a.is_exact_instance_of::<PyString>() && b.is_exact_instance_of::<PyString>() {
        return a.eq(b); // exact strs: runs no Python code
    }
    Ok(false)
}

/// A str of UTF-8 bytes, or None when they are not UTF-8 (the Python path says so).
fn utf8<'py>(py: Python<'py>, raw: &[u8]) -> Option<Bound<'py, PyString>> {
    std::str::from_utf8(raw).ok().map(|s| PyString::new(py, s))
}

/// A name's text from a name cache `texts` (raw bytes -> str, emptied at `cap`
/// entries as the Python caches are), decoding and remembering it on a miss: as
/// UTF-8 (None when it is not), or with `ascii_replace` as ASCII with "replace"
/// (store/records.py _text for an SN: never refused).
fn cached_text<'py>(
    texts: &Bound<'py, PyDict>,
    cap: isize,
    raw: &[u8],
    ascii_replace: bool,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let py = texts.py();
    let key = PyBytes::new(py, raw);
    if let Some(t) = texts.get_item(&key)? {
        return Ok(Some(t));
    }
    let text = if ascii_replace {
        let s: String = raw.iter().map(|&b| if b < 0x80 { b as char } else { '\u{FFFD}' }).collect();
        PyString::new(py, &s)
    } else {
        match utf8(py, raw) {
            Some(s) => s,
            None => return Ok(None),
        }
    };
    if texts.len() as isize >= cap {
        texts.clear();
    }
    texts.set_item(key, &text)?;
    Ok(Some(text.into_any()))
}

// -------------------------------------------------------------- checksums

/// crc16(data, crc=0xFFFF): CRC-16/CCITT-FALSE (binascii.crc_hqx's)
#[pyfunction]
#[pyo3(signature = (data, crc = 0xFFFF))]
fn crc16(data: Bytes<'_>, crc: u32) -> u16 {
    checksum::crc16(data.as_slice(), crc as u16)
}

/// crc32(data, crc=0): zlib's CRC-32
#[pyfunction]
#[pyo3(signature = (data, crc = 0))]
fn crc32(data: Bytes<'_>, crc: u32) -> u32 {
    checksum::crc32(data.as_slice(), crc)
}

// -------------------------------------------------------------- frame MACs

/// A session key's HMAC state, made once per session (`mac_pads`).
#[pyclass(name = "MacPads", module = "lockmq._core", frozen)]
pub struct MacPads(pub MacKey);

/// mac_pads(key) -> MacPads: the session key's HMAC pads, hashed once
#[pyfunction]
fn mac_pads(key: Bytes<'_>) -> MacPads {
    MacPads(MacKey::new(key.as_slice()))
}

/// frame_tag(pads, direction, counter, opcode, flags, opaque, sn, body) -> 16 bytes:
/// protocol/_mac.py frame_tag
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn frame_tag<'py>(
    py: Python<'py>,
    pads: &MacPads,
    direction: u32,
    counter: u64,
    opcode: u32,
    flags: u32,
    opaque: u64,
    sn: Bytes<'_>,
    body: Bytes<'_>,
) -> PyResult<Bound<'py, PyBytes>> {
    let sn = sn.as_slice();
    if sn.len() > 255 {
        return Err(PyValueError::new_err("sn longer than 255 bytes"));
    }
    let head = TagHead {
        direction: direction as u8,
        counter: counter as u32,
        opcode: opcode as u16,
        flags: flags as u8,
        opaque: opaque as u32,
        sn,
    };
    Ok(PyBytes::new(py, &pads.0.tag(&head, body.as_slice())))
}

/// hmac_sha256(key, msg) -> 32 bytes: lockmq/security/keys.py hmac_sha256 (a lock's
/// AUTH proof and its session key: two a handshake)
#[pyfunction]
fn hmac_sha256<'py>(py: Python<'py>, key: Bytes<'_>, msg: Bytes<'_>) -> Bound<'py, PyBytes> {
    PyBytes::new(py, &mac::hmac_sha256(key.as_slice(), msg.as_slice()))
}

// ----------------------------------------------------------- PUBLISH scans

/// The leading run of PUBLISH frames of buf[pos:] this core takes, at most `limit`:
/// their field tuples (Connection._publish's arguments), and where they end. Sealed
/// (`seal`: the session key and its rx counter): each frame's tag checked and cut off
/// its payload, the counter advanced per frame.
fn scan_loop<'py>(
    py: Python<'py>,
    buf: &[u8],
    pos: isize,
    max_frame: isize,
    sn: &Bound<'py, PyString>,
    limit: isize,
    mut seal: Option<(&MacKey, &mut u32)>,
) -> PyResult<(Bound<'py, PyList>, isize)> {
    if pos < 0 {
        return Err(PyValueError::new_err("pos must be >= 0"));
    }
    let sn_utf8 = sn.to_str()?.as_bytes();
    let out = PyList::empty(py);
    let mut at = pos as usize;
    let mut last: Option<(&[u8], Bound<'py, PyString>)> = None;
    while (out.len() as isize) < limit {
        let f = buf.get(at..).unwrap_or(&[]);
        let took = match seal.as_mut() {
            Some((key, rx)) => frame::check_sealed_publish(f, max_frame, sn_utf8, key, **rx),
            None => frame::check_publish_as(f, max_frame, sn_utf8, 0),
        };
        let Check::Take(length) = took else { break };
        // (a sealed frame's fields: those of the frame without its tag)
        let Some(v) = frame::view_publish(f, if seal.is_some() { length - TAG_SIZE } else { length }) else { break };
        let topic = match &last {
            Some((raw, t)) if *raw == v.topic => t.clone(), // the usual case: one topic per connection
            _ => match utf8(py, v.topic) {
                Some(t) => {
                    last = Some((v.topic, t.clone()));
                    t
                }
                None => break, // not UTF-8: Python answers BadBody
            },
        };
        let t = (v.opaque, v.flags, sn, topic, v.seq, v.lock_ts_ms, PyBytes::new(py, v.payload));
        out.append(t)?;
        at += length;
        if let Some((_, rx)) = seal.as_mut() {
            **rx = rx.wrapping_add(1);
        }
    }
    Ok((out, at as isize))
}

/// scan_publishes(buf, pos, max_frame, sn, limit) -> (list, pos): a read's leading
/// run of valid PUBLISH frames under the session's SN as (opaque, flags, sn, topic,
/// seq, lock_ts_ms, payload) tuples (protocol/batch.py scan_publishes)
#[pyfunction]
fn scan_publishes<'py>(
    py: Python<'py>,
    buf: Bytes<'_>,
    pos: isize,
    max_frame: isize,
    sn: &Bound<'py, PyString>,
    limit: isize,
) -> PyResult<(Bound<'py, PyList>, isize)> {
    scan_loop(py, buf.as_slice(), pos, max_frame, sn, limit, None)
}

/// scan_sealed_publishes(buf, pos, max_frame, sn, limit, pads, rx) -> (list, pos, rx):
/// scan_publishes for a session with frame MACs (the reference: the decoder, then the
/// session's tag check, protocol/_mac.py open_frame)
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn scan_sealed_publishes<'py>(
    py: Python<'py>,
    buf: Bytes<'_>,
    pos: isize,
    max_frame: isize,
    sn: &Bound<'py, PyString>,
    limit: isize,
    pads: &MacPads,
    rx: u64,
) -> PyResult<(Bound<'py, PyList>, isize, u32)> {
    let mut rx = rx as u32;
    let (out, end) = scan_loop(py, buf.as_slice(), pos, max_frame, sn, limit, Some((&pads.0, &mut rx)))?;
    Ok((out, end, rx))
}

/// scan_frame(buf, pos, max_frame, known) -> (opcode, sn, flags, opaque, body, end) for
/// the whole, valid frame at buf[pos:] whose opcode is in `known`; None for anything
/// else, which the Python decoder reads and raises its own error for
#[pyfunction]
fn scan_frame<'py>(
    py: Python<'py>,
    buf: Bytes<'_>,
    pos: isize,
    max_frame: isize,
    known: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyTuple>>> {
    if pos < 0 {
        return Err(PyValueError::new_err("pos must be >= 0"));
    }
    let buf = buf.as_slice();
    let Some(f) = buf.get(pos as usize..) else { return Ok(None) };
    let length = match frame::check_header(f, max_frame) {
        Check::Take(n) => n,
        _ => return Ok(None),
    };
    let v = frame::view_frame(f, length);
    if !known.contains(v.opcode)? {
        return Ok(None); // unknown: the decoder raises UnknownOpcode
    }
    let Some(sn) = utf8(py, v.sn) else { return Ok(None) }; // not text: BadFrame
    let t = (v.opcode, sn, v.flags, v.opaque, PyBytes::new(py, v.body), pos + length as isize);
    Ok(Some(t.into_pyobject(py)?))
}

// ------------------------------------------------------------- store codec

/// One record's commit-log bytes; None when the record needs the Python path
/// (headers, a topic not yet validated, an unusual field, too big), which raises the
/// precise InvalidRecord.
fn encode_one<'py>(
    rec: &Bound<'py, PyAny>,
    ts: u64,
    max_record: isize,
    topic_cache: &Bound<'py, PyDict>,
    known: &Bound<'py, PyDict>,
    new_topics: &Bound<'py, PySet>,
) -> PyResult<Option<Bound<'py, PyBytes>>> {
    let py = rec.py();
    let topic = rec.getattr(intern!(py, "topic"))?;
    let sn = rec.getattr(intern!(py, "sn"))?;
    let seq_o = rec.getattr(intern!(py, "seq"))?;
    let ts_o = rec.getattr(intern!(py, "lock_ts_ms"))?;
    let payload = rec.getattr(intern!(py, "payload"))?;
    let headers = rec.getattr(intern!(py, "headers"))?;
    if !topic.is_exact_instance_of::<PyString>() {
        return Ok(None);
    }
    // topic_cache values: (name bytes, flags, length), see records._topic_bytes
    let Some(cached) = topic_cache.get_item(&topic)? else { return Ok(None) };
    let Ok(cached) = cached.downcast_exact::<PyTuple>() else { return Ok(None) };
    if cached.len() != 3 {
        return Ok(None);
    }
    let topic_b = cached.get_item(0)?;
    let Ok(topic_b) = topic_b.downcast_exact::<PyBytes>() else { return Ok(None) };
    let flags: i64 = cached.get_item(1)?.extract()?;
    let (Some(seq), Some(lock_ts)) = (small_uint(&seq_o, MAX_SEQ), small_uint(&ts_o, (1u64 << 63) - 1)) else {
        return Ok(None);
    };
    if !headers.is_none() || !sn.is_exact_instance_of::<PyString>() {
        return Ok(None);
    }
    let Ok(payload) = payload.downcast_exact::<PyBytes>() else { return Ok(None) };
    let sn_s = sn.downcast::<PyString>()?.to_str()?;
    if !sn_s.is_ascii() || sn_s.is_empty() || sn_s.len() > MAX_SN_LEN {
        return Ok(None);
    }
    let f = records::NewFields {
        flags: flags as u8,
        topic: topic_b.as_bytes(),
        sn: sn_s.as_bytes(),
        seq: seq as u32,
        lock_ts_ms: lock_ts,
        broker_ts_us: ts,
        payload: payload.as_bytes(),
    };
    if f.payload.len() as u64 > u32::MAX as u64 - (RECORD_HEADER + f.topic.len() + f.sn.len()) as u64 {
        return Ok(None);
    }
    let size = records::record_size(&f);
    if size as isize > max_record {
        return Ok(None); // the Python path names the limit
    }
    let out = PyBytes::new_with(py, size, |o| {
        records::put_record(o, &f);
        Ok(())
    })?;
    // a topic the store has not seen yet: the caller creates it once
    if !known.contains(&topic)? {
        new_topics.add(&topic)?;
    }
    Ok(Some(out))
}

/// encode_records(records, broker_ts_us, max_record_bytes, topic_cache, known)
///   -> (list of bytes or None, total bytes, set of new topics, count of None):
/// store/records.py encode_records' per-record work for a batch
#[pyfunction]
fn encode_records<'py>(
    py: Python<'py>,
    records: &Bound<'py, PyList>,
    broker_ts_us: u64,
    max_record: isize,
    topic_cache: &Bound<'py, PyDict>,
    known: &Bound<'py, PyDict>,
) -> PyResult<(Bound<'py, PyList>, usize, Bound<'py, PySet>, usize)> {
    let n = records.len();
    let new_topics = PySet::empty(py)?;
    let mut out = Vec::with_capacity(n);
    let (mut total, mut slow) = (0usize, 0usize);
    let mut i = 0;
    while i < n && i < records.len() {
        let rec = records.get_item(i)?; // held while its attributes are read
        match encode_one(&rec, broker_ts_us, max_record, topic_cache, known, &new_topics)? {
            Some(b) => {
                total += b.as_bytes().len();
                out.push(b.into_any());
            }
            None => {
                slow += 1;
                out.push(py.None().into_bound(py));
            }
        }
        i += 1;
    }
    if records.len() != n {
        return Err(PyRuntimeError::new_err("records changed while encoding"));
    }
    Ok((PyList::new(py, out)?, total, new_topics, slow))
}

// --------------------------------------------------------------- acks

/// The acks of results[start:] up to the first that is not an Appended: unsealed,
/// or sealed with counters from `tx` on.
fn acks_run<'py>(
    py: Python<'py>,
    batch: &Bound<'py, PyList>,
    results: &Bound<'py, PyList>,
    start: isize,
    seal: Option<(&MacKey, u32)>,
) -> PyResult<(Bound<'py, PyBytes>, usize, usize, usize, isize)> {
    let n = results.len().min(batch.len()) as isize;
    if start < 0 || start > n {
        return Err(PyValueError::new_err("start out of range"));
    }
    let size = if seal.is_some() { SEALED_ACK_LEN } else { ACK_FRAME_LEN };
    let mut o = vec![0u8; (n - start) as usize * size];
    let (mut frames, mut stored, mut dup) = (0usize, 0usize, 0usize);
    let mut i = start;
    // (sizes re-read each step: __bool__ or __index__ of an item could shrink a list)
    while i < n && (i as usize) < results.len() && (i as usize) < batch.len() {
        let a = results.get_item(i as usize)?;
        let req = batch.get_item(i as usize)?;
        let (Ok(a), Ok(req)) = (a.downcast::<PyTuple>(), req.downcast::<PyTuple>()) else { break };
        if a.len() != 4 || req.len() != 3 {
            break; // a refusal (an exception): the caller answers it
        }
        let is_dup = a.get_item(3)?.is_truthy()?;
        let oneway = req.get_item(1)?.is_truthy()?;
        let offset: i64 = a.get_item(0)?.extract()?;
        let opaque: u64 = req.get_item(0)?.extract()?;
        if is_dup {
            dup += 1;
        } else {
            stored += 1;
        }
        i += 1;
        if oneway {
            continue; // SPEC: a ONEWAY publish is never answered
        }
        let f = &mut o[frames * size..(frames + 1) * size];
        frame::put_publish_ack(
            f,
            opaque as u32,
            is_dup,
            offset,
            seal.map(|(k, tx)| (k, tx.wrapping_add(frames as u32))),
        );
        frames += 1;
    }
    Ok((PyBytes::new(py, &o[..frames * size]), frames, stored, dup, i))
}

/// publish_acks(batch, results, start) -> (bytes, frames, stored, duplicates, next):
/// protocol/batch.py publish_acks
#[pyfunction]
fn publish_acks<'py>(
    py: Python<'py>,
    batch: &Bound<'py, PyList>,
    results: &Bound<'py, PyList>,
    start: isize,
) -> PyResult<(Bound<'py, PyBytes>, usize, usize, usize, isize)> {
    acks_run(py, batch, results, start, None)
}

/// sealed_publish_acks(batch, results, start, pads, tx) -> as publish_acks, the i-th
/// ack sealed with the counter tx + i (protocol/batch.py sealed_publish_acks)
#[pyfunction]
fn sealed_publish_acks<'py>(
    py: Python<'py>,
    batch: &Bound<'py, PyList>,
    results: &Bound<'py, PyList>,
    start: isize,
    pads: &MacPads,
    tx: u64,
) -> PyResult<(Bound<'py, PyBytes>, usize, usize, usize, isize)> {
    acks_run(py, batch, results, start, Some((&pads.0, tx as u32)))
}

// ----------------------------------------------------------- broker loop

/// The record class queue_run and the lane build without its `__init__`: its six
/// `__slots__` and an `__init__` that only fills them (store/records.py NewRecord),
/// with the slots' offsets in the instance. Remembered once checked.
pub struct RecordClass {
    tp: Py<PyType>,
    offsets: [ffi::Py_ssize_t; 6],
}
impl RecordClass {
    pub fn clone_ref(&self, py: Python<'_>) -> RecordClass {
        RecordClass { tp: self.tp.clone_ref(py), offsets: self.offsets }
    }
}

static RECORD_CLASS: Mutex<Option<(Py<PyType>, [ffi::Py_ssize_t; 6])>> = Mutex::new(None);
const RECORD_SLOTS: [&str; 6] = ["topic", "sn", "seq", "lock_ts_ms", "payload", "headers"];

/// `cls` as a record class: object's `__new__`, no `__dict__`, no items, and each slot
/// a writable object member of the class itself (a subclass, with its own `__init__`,
/// is called instead); None when it is not one.
pub fn record_layout(cls: &Bound<'_, PyAny>) -> PyResult<Option<RecordClass>> {
    let py = cls.py();
    let Ok(tp) = cls.downcast::<PyType>() else { return Ok(None) };
    if let Some((known, offsets)) = RECORD_CLASS.lock().unwrap().as_ref() {
        if known.bind(py).is(tp) {
            return Ok(Some(RecordClass { tp: known.clone_ref(py), offsets: *offsets }));
        }
    }
    let object = py.get_type::<pyo3::types::PyAny>();
    // SAFETY: reading fields of live type objects.
    // (CPython's own slot functions, compared by address: one library, one copy)
    let plain = unsafe {
        let (t, o) = (tp.as_type_ptr(), object.as_type_ptr());
        (*t).tp_new.map(|f| f as usize) == (*o).tp_new.map(|f| f as usize)
            && (*t).tp_dictoffset == 0
            && (*t).tp_itemsize == 0
            && (*t).tp_alloc.is_some()
    };
    if !plain {
        return Ok(None);
    }
    let mut offsets = [0 as ffi::Py_ssize_t; 6];
    for (k, name) in RECORD_SLOTS.iter().enumerate() {
        let Ok(d) = tp.getattr(*name) else { return Ok(None) };
        // SAFETY: `d` is checked to be a member descriptor before it is read as one;
        // its member's offset is then checked to lie inside an instance of `tp`.
        let off = unsafe {
            let p = d.as_ptr();
            if ffi::Py_TYPE(p) != std::ptr::addr_of_mut!(ffi::PyMemberDescr_Type) {
                return Ok(None);
            }
            let descr = p as *mut ffi::PyMemberDescrObject;
            if (*descr).d_common.d_type != tp.as_type_ptr() {
                return Ok(None); // another class's slot
            }
            // (pyo3-ffi types d_member as a PyGetSetDef: it is CPython's PyMemberDef)
            let m = (*descr).d_member as *const ffi::PyMemberDef;
            let basic = (*tp.as_type_ptr()).tp_basicsize;
            if (*m).type_code != ffi::Py_T_OBJECT_EX
                || (*m).flags & ffi::Py_READONLY != 0
                || (*m).offset < std::mem::size_of::<ffi::PyObject>() as ffi::Py_ssize_t
                || (*m).offset + std::mem::size_of::<*mut ffi::PyObject>() as ffi::Py_ssize_t > basic
            {
                return Ok(None);
            }
            (*m).offset
        };
        offsets[k] = off;
    }
    *RECORD_CLASS.lock().unwrap() = Some((tp.clone().unbind(), offsets));
    Ok(Some(RecordClass { tp: tp.clone().unbind(), offsets }))
}

/// record_class(topic, sn, seq, lock_ts_ms, payload) as its `__init__` fills it
/// (headers None), without running it: allocated, its six slots written.
pub fn new_record<'py>(
    cls: &RecordClass,
    py: Python<'py>,
    values: [&Bound<'py, PyAny>; 5],
) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: record_layout checked that the class is a plain one with object's __new__,
    // no items and these six object slots inside its instances: its tp_alloc makes a
    // zeroed instance, and each slot gets one new reference.
    unsafe {
        let t = cls.tp.bind(py).as_type_ptr();
        let obj = ((*t).tp_alloc.unwrap())(t, 0);
        if obj.is_null() {
            return Err(PyErr::fetch(py));
        }
        let none = py.None();
        for (k, off) in cls.offsets.iter().enumerate() {
            let v = if k < 5 { values[k].as_ptr() } else { none.as_ptr() };
            ffi::Py_INCREF(v);
            *((obj as *mut u8).offset(*off) as *mut *mut ffi::PyObject) = v;
        }
        Ok(Bound::from_owned_ptr(py, obj))
    }
}

/// queue_run(pubs, start, limit, record_type, queue, records) -> (stop, size):
/// protocol/batch.py queue_run -- the run of scan tuples from pubs[start] on to one
/// topic that want an answer, at most `limit`, queued as Connection._publish does
#[pyfunction]
fn queue_run<'py>(
    pubs: &Bound<'py, PyList>,
    start: isize,
    limit: isize,
    record_type: &Bound<'py, PyAny>,
    queue: &Bound<'py, PyList>,
    records: &Bound<'py, PyList>,
) -> PyResult<(isize, isize)> {
    let py = pubs.py();
    if start < 0 || start as usize > pubs.len() {
        return Err(PyValueError::new_err("start out of range"));
    }
    let layout = record_layout(record_type)?;
    let (queued, recorded) = (queue.len(), records.len());
    let run = (|| -> PyResult<(isize, isize)> {
        let mut topic: Option<Bound<'py, PyAny>> = None;
        let (mut i, mut size) = (start, 0isize);
        while (i as usize) < pubs.len() && i - start < limit {
            let p = pubs.get_item(i as usize)?;
            let p = match p.downcast::<PyTuple>() {
                Ok(t) if t.len() == 7 => t.clone(),
                _ => return Err(PyTypeError::new_err("pubs items must be scan_publishes tuples")),
            };
            let flags = p.get_item(1)?;
            let t = p.get_item(3)?;
            if !flags.is_exact_instance_of::<PyInt>() || !t.is_exact_instance_of::<PyString>() {
                break;
            }
            if flags.extract::<i64>()? & FLAG_ONEWAY as i64 != 0 {
                break;
            }
            match &topic {
                None => topic = Some(t.clone()),
                Some(first) => {
                    if !same_str(&t, first)? {
                        break;
                    }
                }
            }
            let payload = p.get_item(6)?;
            let plen = payload.len()? as isize;
            let (sn, seq, lts) = (p.get_item(2)?, p.get_item(4)?, p.get_item(5)?);
            let rec = if let Some(cls) = &layout {
                new_record(cls, py, [&t, &sn, &seq, &lts, &payload])?
            } else {
                record_type.call1((&t, &sn, &seq, &lts, &payload))?
            };
            let entry = (p.get_item(0)?, false, &rec).into_pyobject(py)?;
            records.append(&rec)?;
            queue.append(entry)?;
            size += plen + 64;
            i += 1;
        }
        Ok((i, size))
    })();
    if run.is_err() {
        // nothing of this call stays queued: the caller answers the error
        if queue.len() > queued {
            queue.del_slice(queued, queue.len())?;
        }
        if records.len() > recorded {
            records.del_slice(recorded, records.len())?;
        }
    }
    run
}

// ------------------------------------------------------------ store writer

/// The state plan_run and plan_calls carry from record to record.
struct Plan<'py> {
    topic: Bound<'py, PyAny>,
    seen: Bound<'py, PySet>,
    hw: Bound<'py, PyDict>,
    ids: Bound<'py, PyList>,
    parts: Bound<'py, PyList>,
    blob: Bound<'py, PyByteArray>,
    appended: Bound<'py, PyType>,
    pos: i64,
    q: i64,
    seg_limit: i64,
    active_base: i64,
}

impl<'py> Plan<'py> {
    /// One record: Ok(true) if it was planned (new, the current topic, no roll),
    /// Ok(false) if Python must handle it.
    fn one(
        &mut self,
        rec: &Bound<'py, PyAny>,
        b: &Bound<'py, PyAny>,
        ts_s: u32,
        res: &Bound<'py, PyList>,
    ) -> PyResult<bool> {
        let py = rec.py();
        let Ok(b) = b.downcast_exact::<PyBytes>() else { return Ok(false) };
        let sn = rec.getattr(intern!(py, "sn"))?;
        let seq = rec.getattr(intern!(py, "seq"))?;
        let rtopic = rec.getattr(intern!(py, "topic"))?;
        let size = b.as_bytes().len() as i64;
        // the same topic, also as another str object (the broker decodes each read's
        // topic anew)
        if !rtopic.is(&self.topic)
            && !(rtopic.is_exact_instance_of::<PyString>()
                && self.topic.is_exact_instance_of::<PyString>()
                && rtopic.eq(&self.topic)?)
        {
            return Ok(false); // a topic switch: Python's
        }
        if self.pos + size > self.seg_limit && self.pos > self.active_base {
            return Ok(false); // a segment roll: Python's
        }
        let key = PyTuple::new(py, [&sn, &seq])?;
        if self.seen.contains(&key)? {
            return Ok(false);
        }
        if let Some(e) = self.hw.get_item(&sn)? {
            // (hw, known, gaps)
            let Ok(e) = e.downcast::<PyTuple>() else { return Ok(false) };
            if e.is_empty() {
                return Ok(false);
            }
            if seq.le(e.get_item(0)?)? {
                return Ok(false); // maybe a duplicate: the dedup table decides, in Python
            }
        }
        // new: index entry, bytes, id, result
        let mut entry = [0u8; 16];
        entry[0..8].copy_from_slice(&(self.pos as u64).to_le_bytes());
        entry[8..12].copy_from_slice(&(size as u32).to_le_bytes());
        entry[12..16].copy_from_slice(&ts_s.to_le_bytes());
        let old = self.blob.len();
        self.blob.resize(old + 16)?;
        // SAFETY: the bytearray was just resized to hold these 16 bytes, and no Python
        // code runs while its contents are borrowed.
        unsafe { self.blob.as_bytes_mut()[old..].copy_from_slice(&entry) };
        let app = tuple_of_type(
            &self.appended,
            [
                self.pos.into_pyobject(py)?.into_any(),
                self.topic.clone(),
                self.q.into_pyobject(py)?.into_any(),
                false.into_pyobject(py)?.to_owned().into_any(),
            ],
        )?;
        self.seen.add(&key)?;
        self.parts.append(b)?;
        self.ids.append(&key)?;
        res.append(app)?;
        self.q += 1;
        self.pos += size;
        Ok(true)
    }
}

/// plan_run(records, enc, i, pos, q, topic, seg_limit, active_base, seen, high_water,
///          ids, parts, blob, results, ts_s, appended) -> (i, pos, q):
/// store/writer.py GroupCommit._plan's loop for the common record
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn plan_run<'py>(
    records: &Bound<'py, PyList>,
    enc: &Bound<'py, PyList>,
    i: isize,
    pos: i64,
    q: i64,
    topic: Bound<'py, PyAny>,
    seg_limit: i64,
    active_base: i64,
    seen: Bound<'py, PySet>,
    high_water: Bound<'py, PyDict>,
    ids: Bound<'py, PyList>,
    parts: Bound<'py, PyList>,
    blob: Bound<'py, PyByteArray>,
    results: &Bound<'py, PyList>,
    ts_s: u64,
    appended: Bound<'py, PyType>,
) -> PyResult<(isize, i64, i64)> {
    check_tuple_type(&appended)?;
    let mut st = Plan { topic, seen, hw: high_water, ids, parts, blob, appended, pos, q, seg_limit, active_base };
    let mut i = i.max(0) as usize;
    while i < records.len() && i < enc.len() {
        if !st.one(&records.get_item(i)?, &enc.get_item(i)?, ts_s as u32, results)? {
            break;
        }
        i += 1;
    }
    Ok((i as isize, st.pos, st.q))
}

/// plan_calls(batch, k, pos, q, topic, seg_limit, active_base, seen, high_water, ids,
///            parts, blob, results, appended) -> (k, i, pos, q, res):
/// plan_run over whole append calls (items (records, enc, n, fut, ts_s)); stops at the
/// first record Python must handle: call k, record i, `res` the call's results so far
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn plan_calls<'py>(
    batch: &Bound<'py, PyList>,
    k: isize,
    pos: i64,
    q: i64,
    topic: Bound<'py, PyAny>,
    seg_limit: i64,
    active_base: i64,
    seen: Bound<'py, PySet>,
    high_water: Bound<'py, PyDict>,
    ids: Bound<'py, PyList>,
    parts: Bound<'py, PyList>,
    blob: Bound<'py, PyByteArray>,
    results: &Bound<'py, PyList>,
    appended: Bound<'py, PyType>,
) -> PyResult<(isize, isize, i64, i64, Bound<'py, PyList>)> {
    let py = batch.py();
    check_tuple_type(&appended)?;
    let mut st = Plan { topic, seen, hw: high_water, ids, parts, blob, appended, pos, q, seg_limit, active_base };
    let mut k = k.max(0) as usize;
    while k < batch.len() {
        let item = batch.get_item(k)?;
        let Ok(item) = item.downcast::<PyTuple>() else { break };
        if item.len() < 5 {
            break;
        }
        let (records, enc, o_ts) = (item.get_item(0)?, item.get_item(1)?, item.get_item(4)?);
        let (Ok(records), Ok(enc)) = (records.downcast_exact::<PyList>(), enc.downcast_exact::<PyList>()) else {
            break;
        };
        if !o_ts.is_exact_instance_of::<PyInt>() {
            break;
        }
        let ts_s = match o_ts.extract::<u64>() {
            Ok(v) if v <= 0xFFFF_FFFF => v as u32,
            _ => break,
        };
        let res = PyList::empty(py);
        let mut i = 0;
        while i < records.len() && i < enc.len() {
            if !st.one(&records.get_item(i)?, &enc.get_item(i)?, ts_s, &res)? {
                // Python's record: hand it the call in progress
                return Ok((k as isize, i as isize, st.pos, st.q, res));
            }
            i += 1;
        }
        results.append(res)?;
        k += 1;
    }
    Ok((k as isize, 0, st.pos, st.q, PyList::empty(py)))
}

/// dedup_run(table, ids, i, window) -> i: store/dedup.py DedupTable.add_many's common
/// case (a lock sending in order), each run of one SN's consecutive ids folded into
/// one update of its entry and one move_to_end; stops at the first other id
#[pyfunction]
fn dedup_run<'py>(table: &Bound<'py, PyAny>, ids: &Bound<'py, PyList>, i: isize, window: i64) -> PyResult<isize> {
    let py = table.py();
    let Ok(dict) = table.downcast::<PyDict>() else {
        return Err(PyTypeError::new_err("table must be a dict"));
    };
    let mut i = i.max(0) as usize;
    while i < ids.len() {
        let id = ids.get_item(i)?;
        let Ok(id) = id.downcast_exact::<PyTuple>() else { break };
        if id.len() != 2 {
            break;
        }
        let sn = id.get_item(0)?;
        if !sn.is_exact_instance_of::<PyString>() {
            break;
        }
        let Some(seq) = exact_i64(&id.get_item(1)?) else { break };
        // (the plain dict lookup, as C's PyDict_GetItem on an OrderedDict)
        let Some(e) = dict.get_item(&sn)? else { break }; // a new SN: add() (it may evict)
        let Ok(e) = e.downcast_exact::<PyTuple>() else { break };
        if e.len() != 3 {
            break;
        }
        let (Some(hw), Some(known), Some(gaps)) =
            (exact_i64(&e.get_item(0)?), exact_i64(&e.get_item(1)?), exact_i64(&e.get_item(2)?))
        else {
            break;
        };
        if gaps != 0 || hw >= i64::MAX / 2 || seq != hw + 1 {
            break;
        }
        let mut j = i + 1;
        let mut last = seq;
        while j < ids.len() {
            // the same SN's next ids, in order
            let id2 = ids.get_item(j)?;
            let Ok(id2) = id2.downcast_exact::<PyTuple>() else { break };
            if id2.len() != 2 || !same_str(&id2.get_item(0)?, &sn)? {
                break;
            }
            match exact_i64(&id2.get_item(1)?) {
                Some(s2) if s2 == last + 1 && last < i64::MAX / 2 => last = s2,
                _ => break,
            }
            j += 1;
        }
        let known = (known + (last - hw)).min(window);
        table.set_item(&sn, (last, known, 0))?;
        table.call_method1(intern!(py, "move_to_end"), (&sn,))?;
        i = j;
    }
    Ok(i as isize)
}

/// commit_write(index_writes, fd, parts, pos, sync) -> None: store/writer.py
/// GroupCommit._write for one segment -- each (index fd, entries, position), then the
/// parts joined at pos of fd in one write, then fdatasync if sync, with the GIL
/// released once for all of it. OSError (errno set) on an error.
#[pyfunction]
fn commit_write<'py>(
    py: Python<'py>,
    index_writes: &Bound<'py, PyList>,
    fd: i32,
    parts: &Bound<'py, PyList>,
    pos: i64,
    sync: &Bound<'py, PyAny>,
) -> PyResult<()> {
    let sync = sync.is_truthy()?;
    let mut iw: Vec<(i32, Bytes<'py>, i64)> = Vec::with_capacity(index_writes.len());
    for t in index_writes.iter() {
        let Ok(t) = t.downcast::<PyTuple>() else {
            return Err(PyTypeError::new_err("index_writes: (fd, entries, position)"));
        };
        let (ifd, b, ipos): (i32, Bound<'py, PyAny>, i64) = t.extract()?;
        iw.push((ifd, Bytes::of(&b)?, ipos));
    }
    let bufs: Vec<Bytes<'py>> = parts.iter().map(|p| Bytes::of(&p)).collect::<PyResult<_>>()?;
    let iws: Vec<(i32, &[u8], i64)> = iw.iter().map(|(f, b, p)| (*f, b.as_slice(), *p)).collect();
    let slices: Vec<&[u8]> = bufs.iter().map(|b| b.as_slice()).collect();
    let rc = py.allow_threads(|| -> std::io::Result<()> {
        let write = |fd: i32, data: &[u8], at: i64| -> std::io::Result<()> {
            // SAFETY: the fd is the caller's and stays open; ManuallyDrop never closes it.
            let f = ManuallyDrop::new(unsafe { File::from_raw_fd(fd) });
            f.write_all_at(data, at as u64)
        };
        for (ifd, data, ipos) in &iws {
            write(*ifd, data, *ipos)?;
        }
        // the parts are joined into one buffer and written with one pwrite: a pwritev
        // of a thousand small parts cost the kernel more than the copy costs here
        match slices.len() {
            0 => {}
            1 => write(fd, slices[0], pos)?,
            _ => write(fd, &slices.concat(), pos)?,
        }
        if sync {
            // SAFETY: as above.
            let f = ManuallyDrop::new(unsafe { File::from_raw_fd(fd) });
            f.sync_data()?;
        }
        Ok(())
    });
    rc.map_err(|e| match e.raw_os_error() {
        Some(errno) => PyOSError::new_err((errno, std::io::Error::from_raw_os_error(errno).to_string())),
        None => PyOSError::new_err((5, e.to_string())), // a write of 0 bytes: EIO, as C
    })
}

// -------------------------------------------------------- consumer side

/// A lease's fields for its MESSAGES entry; None for one the Python encoder must
/// write (headers or retries, a field out of its wire range).
fn view_lease<'py>(
    lease: &Bound<'py, PyAny>,
) -> Option<(u64, u16, u32, u64, u64, Bound<'py, PyString>, Bound<'py, PyString>, Bound<'py, PyBytes>)> {
    let py = lease.py();
    let rec = lease.getattr(intern!(py, "rec")).ok()?;
    let wire = lease.getattr(intern!(py, "wire")).ok()?;
    let dl = lease.getattr(intern!(py, "deliveries")).ok()?;
    let rt = lease.getattr(intern!(py, "retries")).ok()?;
    let rec = rec.downcast::<PyTuple>().ok()?;
    if rec.len() != 9 {
        return None;
    }
    let headers = rec.get_item(7).ok()?;
    let no_headers = headers.is_none() || headers.downcast_exact::<PyDict>().map(|d| d.is_empty()).unwrap_or(false);
    if !no_headers || small_uint(&rt, 0) != Some(0) {
        return None; // (retries: the Python encoder)
    }
    let delivery = small_uint(&dl, 0xFFFF)? as u16;
    let seq = small_uint(&rec.get_item(4).ok()?, MAX_SEQ)? as u32;
    // (u64 on the wire: a retry's queue offset has its top bit set)
    let wire: u64 = wire.extract().ok()?;
    let lts: u64 = rec.get_item(5).ok()?.extract().ok()?;
    let bts: u64 = rec.get_item(6).ok()?.extract().ok()?;
    let payload = rec.get_item(8).ok()?.downcast_exact::<PyBytes>().ok()?.clone();
    if payload.as_bytes().len() as u64 > 0xFFFF_FFFF {
        return None;
    }
    let str8 = |o: Bound<'py, PyAny>| -> Option<Bound<'py, PyString>> {
        let s = o.downcast::<PyString>().ok()?.clone();
        (s.to_str().ok()?.len() <= 255).then_some(s)
    };
    let sn = str8(rec.get_item(3).ok()?)?;
    let topic = str8(rec.get_item(2).ok()?)?;
    Some((wire, delivery, seq, lts, bts, sn, topic, payload))
}

/// encode_leases(sub_id, leases) -> bytes or None: broker/connection.py encode_leases
/// for a pull's leases when none has headers or retries; None for any other batch
#[pyfunction]
fn encode_leases<'py>(
    py: Python<'py>,
    sub_id: u64,
    leases: &Bound<'py, PyList>,
) -> PyResult<Option<Bound<'py, PyBytes>>> {
    let n = leases.len();
    if n > 0xFFFF || sub_id > 0xFFFF_FFFF {
        return Ok(None);
    }
    let mut views = Vec::with_capacity(n);
    for l in leases.iter() {
        match view_lease(&l) {
            Some(v) => views.push(v),
            None => return Ok(None),
        }
    }
    let mut fields = Vec::with_capacity(n);
    for (wire, delivery, seq, lts, bts, sn, topic, payload) in &views {
        fields.push(messages::LeaseFields {
            wire: *wire,
            delivery: *delivery,
            seq: *seq,
            lock_ts_ms: *lts,
            broker_ts_us: *bts,
            sn: sn.to_str()?.as_bytes(),
            topic: topic.to_str()?.as_bytes(),
            payload: payload.as_bytes(),
        });
    }
    let size = 6 + fields.iter().map(messages::lease_size).sum::<usize>();
    let out = PyBytes::new_with(py, size, |w| {
        messages::put_messages(w, sub_id as u32, &fields);
        Ok(())
    })?;
    Ok(Some(out))
}

/// read_run(data, base, entries, i, j, queue_offset, topic, topic_bytes, record_type,
///          texts, cap, out) -> m: store/reads.py read_topic's records entries[i:j] of
/// one pread at commit-log offset `base`, each appended to `out` as decode_record
/// makes it; the index of the first it did not take (decode_record reads that one)
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn read_run<'py>(
    data: Bytes<'_>,
    base: i64,
    entries: &Bound<'py, PyList>,
    i: isize,
    j: isize,
    queue_offset: i64,
    topic: &Bound<'py, PyString>,
    topic_bytes: Bytes<'_>,
    record_type: &Bound<'py, PyType>,
    texts: &Bound<'py, PyDict>,
    cap: isize,
    out: &Bound<'py, PyList>,
) -> PyResult<isize> {
    let py = entries.py();
    // (tuple_of_type below: a tuple subtype without a dict, as a StoredRecord is)
    check_tuple_type(record_type).map_err(|_| PyTypeError::new_err("read_run: record_type must be a tuple type"))?;
    let (b, want) = (data.as_slice(), topic_bytes.as_slice());
    let j = j.min(entries.len() as isize);
    let mut m = i.max(0);
    while m < j {
        let e = entries.get_item(m as usize)?;
        let off = match e.downcast::<PyTuple>() {
            Ok(t) if !t.is_empty() => match exact_i64(&t.get_item(0)?) {
                Some(o) if o >= 0 => o,
                _ => break,
            },
            _ => break,
        };
        if off < base || off - base > b.len() as i64 - RECORD_HEADER as i64 {
            break;
        }
        let Some(v) = records::view_record(&b[(off - base) as usize..], want) else { break };
        let Some(sn) = cached_text(texts, cap, v.sn, true)? else { break };
        let rec = tuple_of_type(
            record_type,
            [
                off.into_pyobject(py)?.into_any(),
                (queue_offset + m as i64).into_pyobject(py)?.into_any(),
                topic.clone().into_any(),
                sn,
                v.seq.into_pyobject(py)?.into_any(),
                v.lock_ts_ms.into_pyobject(py)?.into_any(),
                v.broker_ts_us.into_pyobject(py)?.into_any(),
                py.None().into_bound(py),
                PyBytes::new(py, v.payload).into_any(),
            ],
        )?;
        out.append(rec)?;
        m += 1;
    }
    Ok(m)
}

/// messages_fields(body, texts, cap) -> (sub_id, rows) or None: a MESSAGES body as one
/// tuple per message (topic, sn, seq, payload, delivery, lock_ts_ms, broker_ts_us,
/// headers bytes, queue_offset), the order lockmq.client.Message takes; None for any
/// body the Python decoder would refuse
#[pyfunction]
fn messages_fields<'py>(
    py: Python<'py>,
    body: Bytes<'_>,
    texts: &Bound<'py, PyDict>,
    cap: isize,
) -> PyResult<Option<(u32, Bound<'py, PyList>)>> {
    let Some((sub_id, msgs)) = messages::parse_messages(body.as_slice()) else { return Ok(None) };
    let mut rows = Vec::with_capacity(msgs.len());
    for m in &msgs {
        let Some(sn) = cached_text(texts, cap, m.sn, false)? else { return Ok(None) };
        let Some(topic) = cached_text(texts, cap, m.topic, false)? else { return Ok(None) };
        rows.push(
            (
                topic,
                sn,
                m.seq,
                PyBytes::new(py, m.payload),
                m.delivery,
                m.lock_ts_ms,
                m.broker_ts_us,
                PyBytes::new(py, m.headers),
                m.queue_offset,
            )
                .into_pyobject(py)?,
        );
    }
    Ok(Some((sub_id, PyList::new(py, rows)?)))
}

// ------------------------------------------------------------------ module

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("API", crate::API)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("SHA256", mac::sha256_impl())?;
    let consts = PyDict::new(m.py());
    for (name, value) in ALL {
        consts.set_item(name, value)?;
    }
    m.add("CONSTANTS", consts)?;
    m.add_class::<MacPads>()?;
    m.add_class::<crate::lane::Lane>()?;
    m.add_class::<crate::lane::LanePlan>()?;
    m.add_function(wrap_pyfunction!(crc16, m)?)?;
    m.add_function(wrap_pyfunction!(crc32, m)?)?;
    m.add_function(wrap_pyfunction!(mac_pads, m)?)?;
    m.add_function(wrap_pyfunction!(frame_tag, m)?)?;
    m.add_function(wrap_pyfunction!(hmac_sha256, m)?)?;
    m.add_function(wrap_pyfunction!(scan_publishes, m)?)?;
    m.add_function(wrap_pyfunction!(scan_sealed_publishes, m)?)?;
    m.add_function(wrap_pyfunction!(scan_frame, m)?)?;
    m.add_function(wrap_pyfunction!(encode_records, m)?)?;
    m.add_function(wrap_pyfunction!(publish_acks, m)?)?;
    m.add_function(wrap_pyfunction!(sealed_publish_acks, m)?)?;
    m.add_function(wrap_pyfunction!(queue_run, m)?)?;
    m.add_function(wrap_pyfunction!(plan_run, m)?)?;
    m.add_function(wrap_pyfunction!(plan_calls, m)?)?;
    m.add_function(wrap_pyfunction!(dedup_run, m)?)?;
    m.add_function(wrap_pyfunction!(commit_write, m)?)?;
    m.add_function(wrap_pyfunction!(encode_leases, m)?)?;
    m.add_function(wrap_pyfunction!(read_run, m)?)?;
    m.add_function(wrap_pyfunction!(messages_fields, m)?)?;
    Ok(())
}
