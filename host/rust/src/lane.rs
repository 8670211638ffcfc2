//! The lane (broker/lane.py): a lock's steady publish reads and their acks below
//! Python. A connection in its steady state -- established, only PUBLISHes to topics
//! its Python path allowed -- is adopted: its transport stops reading and its socket
//! joins the lane's epoll set, which the loop watches as one fd. One `poll` reads
//! every ready socket, checks each frame as scan_publishes does (a sealed session's
//! tags too) and returns the records of all of them with one plan of who gets which
//! ack; one `answer` packs and sends every ack of a group commit.
//!
//! Whatever is not that steady state goes back to the connection's Python path with
//! the unread bytes ("bail"): another opcode, a bad or ONEWAY frame, a bad tag,
//! another SN, a topic not allowed yet, the rate credit used up, EOF or a socket error.
//! The Python path then raises the protocol's own errors. The lane never writes while
//! Python holds unsent bytes for the socket: Python takes a socket back (release)
//! before it writes to it, and an ack the socket does not take whole is handed to
//! Python too.
//!
//! Per socket the lane keeps a partial frame (at most max_frame bytes), the bytes of
//! records read and not yet answered (above `limit` it stops reading the socket until
//! answers bring them to half) and a rate credit (-1: no limit). Slots carry a
//! generation so that an answer for a socket released (and its fd number reused) is
//! never written to the new one.
//!
//! Only the event loop's thread calls the lane (broker/lane.py): the mutex is the
//! frozen class's state, taken for each call's whole run.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Mutex, MutexGuard};

use pyo3::exceptions::{PyOSError, PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyFloat, PyList, PySet, PyString, PyTuple};

use crate::binding::{new_record, record_layout, MacPads, RecordClass};
use crate::consts::*;
use crate::frame::{self, Check};
use crate::mac::MacKey;

const LANE_EVENTS: usize = 256;
/// bytes read per socket per poll, beyond a held partial frame
const LANE_READ: usize = 65536;

struct Slot {
    conn: Py<PyAny>,
    sn: Py<PyString>,
    sn_utf8: Vec<u8>,
    topics: Py<PySet>,
    credit: i64,
    pending: i64,
    limit: i64,
    gen: u64,
    paused: bool,
    tail: Vec<u8>,
    /// a session with frame MACs: its key, and the frames opened from / sealed to the
    /// lock so far (the lane keeps the counters while it holds the socket)
    seal: Option<MacKey>,
    rx: u32,
    tx: u32,
}

struct State {
    epfd: OwnedFd,
    slots: HashMap<i32, Slot>,
    next_gen: u64,
    max_frame: usize,
    rbuf: Vec<u8>,
    record_type: RecordClass,
}

/// One record of a poll: whose ack it is.
struct PlanEntry {
    conn: Py<PyAny>,
    fd: i32,
    gen: u64,
    opaque: u32,
    size: u32,
    sealed: bool,
}

/// Who gets which ack of one Lane.poll (opaque to Python; len: records).
#[pyclass(name = "LanePlan", module = "lockmq._core", frozen)]
pub struct LanePlan(Vec<PlanEntry>);

#[pymethods]
impl LanePlan {
    fn __len__(&self) -> usize {
        self.0.len()
    }
}

/// Lane(record_type, max_frame): steady publish reads and their acks (see lane.rs
/// and broker/lane.py).
#[pyclass(name = "Lane", module = "lockmq._core", frozen)]
pub struct Lane(Mutex<State>);

fn os_error() -> PyErr {
    let e = std::io::Error::last_os_error();
    PyOSError::new_err((e.raw_os_error().unwrap_or(5), e.to_string()))
}

fn epoll_ctl(epfd: i32, op: i32, fd: i32, events: u32) -> PyResult<()> {
    let mut ev = libc::epoll_event { events, u64: fd as u64 };
    // SAFETY: a plain system call on an epoll fd the lane owns, with a valid event.
    if unsafe { libc::epoll_ctl(epfd, op, fd, &mut ev) } < 0 {
        return Err(os_error());
    }
    Ok(())
}

impl State {
    /// Take fd out of the lane: (conn, held bytes, credit left, rx, tx) for Python
    /// (`extra`: unread bytes of this poll, after the held tail).
    fn detach<'py>(&mut self, py: Python<'py>, fd: i32, extra: &[u8]) -> PyResult<Bound<'py, PyTuple>> {
        let s = self.slots.remove(&fd).expect("detach of a slot in the lane");
        if !s.paused {
            // (a paused socket is out of the set already; this fails only if fd was closed)
            let _ = epoll_ctl(self.epfd.as_raw_fd(), libc::EPOLL_CTL_DEL, fd, 0);
        }
        let mut data = s.tail;
        data.extend_from_slice(extra);
        (s.conn, PyBytes::new(py, &data), s.credit, s.rx, s.tx).into_pyobject(py)
    }

    fn slot_of(&mut self, fd: i32, gen: u64) -> Option<&mut Slot> {
        self.slots.get_mut(&fd).filter(|s| gen == 0 || s.gen == gen)
    }
}

/// One socket's read `buf`: its whole PUBLISH frames become records (and plan
/// entries); returns where the lane stops taking frames -- buf.len() when it took
/// them all (a partial frame is then kept in the slot's tail), less when the rest is
/// Python's (a bail).
#[allow(clippy::too_many_arguments)]
fn take<'py>(
    py: Python<'py>,
    s: &mut Slot,
    fd: i32,
    buf: &[u8],
    max_frame: usize,
    record_type: &RecordClass,
    records: &Bound<'py, PyList>,
    plan: &mut Vec<PlanEntry>,
    frames: &mut usize,
) -> PyResult<usize> {
    let mut pos = 0;
    let mut topic: Option<(&[u8], Bound<'py, PyString>)> = None; // the last topic (one per lock, usually)
    let sn = s.sn.bind(py).clone().into_any();
    while pos < buf.len() {
        let f = &buf[pos..];
        let got = match &s.seal {
            // (a bad tag stops here: the session's path says BAD_MAC)
            Some(key) => frame::check_sealed_publish(f, max_frame as isize, &s.sn_utf8, key, s.rx),
            None => frame::check_publish_as(f, max_frame as isize, &s.sn_utf8, 0),
        };
        let length = match got {
            Check::Partial => {
                // a frame's first bytes: kept for the next read (length <= max_frame)
                s.tail = f.to_vec();
                return Ok(buf.len());
            }
            Check::Stop => break,
            Check::Take(n) => n,
        };
        // (a sealed frame's fields: those of the frame without its tag)
        let Some(v) = frame::view_publish(f, if s.seal.is_some() { length - TAG_SIZE } else { length }) else { break };
        if v.flags & FLAG_ONEWAY != 0 || s.credit == 0 {
            break; // the Python path's: ONEWAY's no-answer rule; the lock's rate budget
        }
        let t = match &topic {
            Some((raw, t)) if *raw == v.topic => t.clone(),
            _ => {
                let Ok(text) = std::str::from_utf8(v.topic) else { break };
                let t = PyString::new(py, text);
                if !s.topics.bind(py).contains(&t)? {
                    break; // not allowed yet: Python checks it (and may allow it)
                }
                topic = Some((v.topic, t.clone()));
                t
            }
        };
        let (seq, ts, payload) =
            (v.seq.into_pyobject(py)?, v.lock_ts_ms.into_pyobject(py)?, PyBytes::new(py, v.payload));
        let rec = new_record(record_type, py, [t.as_any(), &sn, seq.as_any(), ts.as_any(), payload.as_any()])?;
        let size = (v.payload.len() + 64) as u32; // Connection._pub_size's measure
        records.append(rec)?;
        plan.push(PlanEntry {
            conn: s.conn.clone_ref(py),
            fd,
            gen: s.gen,
            opaque: v.opaque,
            size,
            sealed: s.seal.is_some(),
        });
        s.pending += size as i64;
        if s.credit > 0 {
            s.credit -= 1;
        }
        if s.seal.is_some() {
            s.rx = s.rx.wrapping_add(1);
        }
        *frames += 1;
        pos += length;
    }
    Ok(pos)
}

impl Lane {
    /// The lane's state (one thread calls the lane: never contended).
    fn state(&self, _py: Python<'_>) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[pymethods]
impl Lane {
    #[new]
    fn new(record_type: &Bound<'_, PyAny>, max_frame: isize) -> PyResult<Lane> {
        let Some(record_type) = record_layout(record_type)? else {
            return Err(PyTypeError::new_err("Lane needs a record class with six own slots"));
        };
        if max_frame < MIN_FRAME as isize || max_frame > 1 << 30 {
            return Err(PyValueError::new_err("max_frame out of range"));
        }
        // SAFETY: a plain system call; the new fd is owned from here on.
        let epfd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if epfd < 0 {
            return Err(os_error());
        }
        Ok(Lane(Mutex::new(State {
            epfd: unsafe { OwnedFd::from_raw_fd(epfd) },
            slots: HashMap::new(),
            next_gen: 1,
            max_frame: max_frame as usize,
            rbuf: vec![0u8; max_frame as usize + LANE_READ],
            record_type,
        })))
    }

    /// The epoll fd the loop watches.
    fn fileno(&self, py: Python<'_>) -> i32 {
        self.state(py).epfd.as_raw_fd()
    }

    /// adopt(fd, conn, sn, topics, credit, limit, pads=None, rx=0, tx=0): read fd's
    /// steady publishes here (pads, rx, tx: a session with frame MACs, its mac_pads
    /// and counters, which release hands back).
    #[pyo3(signature = (fd, conn, sn, topics, credit, limit, pads = None, rx = 0, tx = 0))]
    #[allow(clippy::too_many_arguments)]
    fn adopt(
        &self,
        py: Python<'_>,
        fd: i32,
        conn: Py<PyAny>,
        sn: &Bound<'_, PyString>,
        topics: &Bound<'_, PySet>,
        credit: i64,
        limit: i64,
        pads: Option<PyRef<'_, MacPads>>,
        rx: u64,
        tx: u64,
    ) -> PyResult<()> {
        let mut st = self.state(py);
        if !(0..1 << 24).contains(&fd) || limit <= 0 {
            return Err(PyValueError::new_err("fd or limit out of range"));
        }
        if st.slots.contains_key(&fd) {
            return Err(PyValueError::new_err("fd is in the lane already"));
        }
        let sn_utf8 = sn.to_str()?.as_bytes().to_vec();
        if sn_utf8.len() > MAX_SN {
            return Err(PyValueError::new_err("sn too long"));
        }
        epoll_ctl(st.epfd.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, libc::EPOLLIN as u32)?;
        let gen = st.next_gen;
        st.next_gen += 1;
        let seal = pads.map(|p| p.0.clone());
        st.slots.insert(
            fd,
            Slot {
                conn,
                sn: sn.clone().unbind(),
                sn_utf8,
                topics: topics.clone().unbind(),
                credit,
                pending: 0,
                limit,
                gen,
                paused: false,
                tail: Vec::new(),
                rx: if seal.is_some() { rx as u32 } else { 0 },
                tx: if seal.is_some() { tx as u32 } else { 0 },
                seal,
            },
        );
        Ok(())
    }

    /// release(fd) -> (conn, held bytes, credit left, rx, tx), or None if fd is not
    /// in the lane: give fd back to Python (rx, tx: a sealed session's counters now).
    fn release<'py>(&self, py: Python<'py>, fd: i32) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let mut st = self.state(py);
        if st.slot_of(fd, 0).is_none() {
            return Ok(None);
        }
        Ok(Some(st.detach(py, fd, &[])?))
    }

    /// poll(max_records) -> (records, plan, bails, bytes_in, frames_in)
    ///
    /// Reads each ready socket once. `records`: NewRecords for the store, in order;
    /// `plan`: whose ack each is (for answer()); `bails`: (conn, bytes, credit, rx, tx)
    /// of each socket the lane gave back this poll (bytes: what Python must read now,
    /// empty at EOF or on an error: the transport, reading again, sees it).
    fn poll<'py>(
        &self,
        py: Python<'py>,
        max_records: isize,
    ) -> PyResult<(Bound<'py, PyList>, LanePlan, Bound<'py, PyList>, usize, usize)> {
        let mut guard = self.state(py);
        let st = &mut *guard;
        let mut ev = [libc::epoll_event { events: 0, u64: 0 }; LANE_EVENTS];
        // SAFETY: epoll_wait writes at most LANE_EVENTS events into `ev`.
        let k = unsafe { libc::epoll_wait(st.epfd.as_raw_fd(), ev.as_mut_ptr(), LANE_EVENTS as i32, 0) };
        if k < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return Err(os_error());
        }
        let records = PyList::empty(py);
        let bails = PyList::empty(py);
        let mut plan = Vec::new();
        let now = PyFloat::new(py, monotonic());
        let record_type = st.record_type.clone_ref(py);
        let (mut bytes_in, mut frames) = (0usize, 0usize);
        let (epfd, max_frame) = (st.epfd.as_raw_fd(), st.max_frame);
        let mut rbuf = std::mem::take(&mut st.rbuf);
        let result = (|| -> PyResult<()> {
            for e in ev.iter().take(k.max(0) as usize) {
                if records.len() as isize >= max_records {
                    break;
                }
                let fd = e.u64 as i32;
                let Some(s) = st.slot_of(fd, 0) else { continue };
                if s.paused {
                    continue;
                }
                let held = s.tail.len();
                rbuf[..held].copy_from_slice(&s.tail);
                // SAFETY: recv writes at most rbuf.len() - held bytes after the held ones.
                let r = unsafe { libc::recv(fd, rbuf[held..].as_mut_ptr().cast(), rbuf.len() - held, 0) };
                if r < 0 {
                    let errno = std::io::Error::last_os_error().raw_os_error();
                    if matches!(errno, Some(libc::EAGAIN) | Some(libc::EINTR)) {
                        continue;
                    }
                }
                if r <= 0 {
                    // EOF or a socket error: the transport reads it again (its tail
                    // still holds the partial frame, if any)
                    bails.append(st.detach(py, fd, &[])?)?;
                    continue;
                }
                let n = held + r as usize;
                s.tail.clear();
                bytes_in += r as usize;
                s.conn.bind(py).setattr(intern!(py, "last_seen"), &now)?;
                let pos = take(py, s, fd, &rbuf[..n], max_frame, &record_type, &records, &mut plan, &mut frames)?;
                if pos == n {
                    if s.pending > s.limit {
                        // out of the set (a hang-up is reported whatever the mask)
                        epoll_ctl(epfd, libc::EPOLL_CTL_DEL, fd, 0)?;
                        s.paused = true;
                    }
                    continue;
                }
                bytes_in -= n - pos; // (Python counts what it reads)
                bails.append(st.detach(py, fd, &rbuf[pos..n])?)?;
            }
            Ok(())
        })();
        st.rbuf = rbuf;
        result?;
        Ok((records, LanePlan(plan), bails, bytes_in, frames))
    }

    /// answer(plan, results) -> (stored, duplicates, frames_out, bytes_out, leftovers)
    ///
    /// The store's results for one poll's records, in order. Each socket still in
    /// the lane gets its acks in one send; what the lane cannot finish is a leftover
    /// for Python, one per connection: (1, conn, batch, results) when a record was
    /// refused, or a sealed session's socket left the lane (Connection's answer path
    /// answers them all, in order); (2, conn, acks, frames) when the socket left the
    /// lane (Python writes them); (3, conn, unsent, held, credit, rx, tx) when the
    /// socket did not take its acks whole (given back as release() does; Python
    /// writes the rest). A sealed session's acks in the lane take the slot's counter.
    fn answer<'py>(
        &self,
        py: Python<'py>,
        plan: PyRef<'py, LanePlan>,
        results: &Bound<'py, PyList>,
    ) -> PyResult<(usize, usize, usize, usize, Bound<'py, PyList>)> {
        let mut guard = self.state(py);
        let st = &mut *guard;
        let plan = &plan.0;
        if results.len() != plan.len() {
            return Err(PyValueError::new_err("one result per planned record"));
        }
        let leftovers = PyList::empty(py);
        let (mut stored, mut dup, mut frames_out, mut bytes_out) = (0usize, 0usize, 0usize, 0usize);
        let mut acks: Vec<u8> = Vec::new();
        let epfd = st.epfd.as_raw_fd();
        let mut i = 0;
        while i < plan.len() {
            let e = &plan[i];
            let mut j = i;
            let (mut refused, mut size) = (false, 0i64);
            while j < plan.len() && plan[j].conn.is(&e.conn) && plan[j].gen == e.gen {
                size += plan[j].size as i64;
                let a = results.get_item(j)?;
                if !matches!(a.downcast::<PyTuple>(), Ok(t) if t.len() == 4) {
                    refused = true;
                }
                j += 1;
            }
            let in_lane = match st.slot_of(e.fd, e.gen) {
                Some(s) => {
                    s.pending -= size;
                    if s.paused && s.pending <= s.limit / 2 {
                        epoll_ctl(epfd, libc::EPOLL_CTL_ADD, e.fd, libc::EPOLLIN as u32)?;
                        s.paused = false;
                    }
                    true
                }
                None => false,
            };
            // Python answers the group, refusals and acks in order, when one was
            // refused, and a sealed session's acks once the socket has left the lane:
            // their tags take the session's counters, which are Python's again
            if refused || (e.sealed && !in_lane) {
                let batch = PyList::empty(py);
                for m in &plan[i..j] {
                    batch.append((m.opaque, false, py.None()))?;
                }
                leftovers.append((1, &e.conn, batch, results.get_slice(i, j)))?;
                i = j;
                continue;
            }
            let sealed = in_lane && st.slot_of(e.fd, e.gen).is_some_and(|s| s.seal.is_some());
            let unit = if sealed { SEALED_ACK_LEN } else { ACK_FRAME_LEN };
            let len = (j - i) * unit;
            acks.clear();
            acks.resize(len, 0);
            for (k, m) in plan[i..j].iter().enumerate() {
                let a = results.get_item(i + k)?;
                let a = a.downcast::<PyTuple>()?;
                let is_dup = a.get_item(3)?.is_truthy()?;
                let offset: i64 = a.get_item(0)?.extract()?;
                if is_dup {
                    dup += 1;
                } else {
                    stored += 1;
                }
                let f = &mut acks[k * unit..(k + 1) * unit];
                if sealed {
                    // (the slot's counter: Python's session gets it back on release)
                    let s = st.slot_of(e.fd, e.gen).unwrap();
                    let tx = s.tx;
                    s.tx = s.tx.wrapping_add(1);
                    frame::put_publish_ack(f, m.opaque, is_dup, offset, Some((s.seal.as_ref().unwrap(), tx)));
                } else {
                    frame::put_publish_ack(f, m.opaque, is_dup, offset, None);
                }
            }
            frames_out += j - i;
            let mut sent = 0usize;
            if in_lane {
                // SAFETY: send reads `len` bytes of `acks`.
                let w = unsafe { libc::send(e.fd, acks.as_ptr().cast(), len, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
                sent = w.max(0) as usize;
                bytes_out += sent;
            }
            if sent < len {
                let rest = PyBytes::new(py, &acks[sent..len]);
                if in_lane {
                    // the socket is Python's again, with the rest to write
                    let back = st.detach(py, e.fd, &[])?;
                    leftovers.append((
                        3,
                        &e.conn,
                        rest,
                        back.get_item(1)?,
                        back.get_item(2)?,
                        back.get_item(3)?,
                        back.get_item(4)?,
                    ))?;
                } else {
                    leftovers.append((2, &e.conn, rest, j - i))?;
                }
            }
            i = j;
        }
        Ok((stored, dup, frames_out, bytes_out, leftovers))
    }

    /// How many sockets are in the lane.
    fn adopted(&self, py: Python<'_>) -> usize {
        self.state(py).slots.len()
    }

    /// Drop every socket (no answers).
    fn close(&self, py: Python<'_>) {
        let mut st = self.state(py);
        let epfd = st.epfd.as_raw_fd();
        for (fd, s) in st.slots.drain() {
            if !s.paused {
                let _ = epoll_ctl(epfd, libc::EPOLL_CTL_DEL, fd, 0);
            }
        }
    }
}

/// time.monotonic()'s clock on Linux
fn monotonic() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime fills the timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}
