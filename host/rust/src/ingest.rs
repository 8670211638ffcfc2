//! The ingest (broker/ingest.py): a plain-TCP listener's new sockets, below Python,
//! up to the lock's AUTH. It accepts, holds each socket in its epoll set, reads the
//! CONNECT of a lock and sends the CHALLENGE (handshake.rs: the Python session's bytes),
//! and gives the socket to Python -- one path, `poll`'s `back` list -- as soon as
//! anything else is due: the AUTH (or any byte after the CHALLENGE), a CONNECT it does
//! not serve, EOF or a socket error, a CHALLENGE the socket did not take whole, the
//! handshake deadline. With the socket go the bytes read and not yet Python's, and the
//! session so far (the CONNECT frame, the nonce, the CHALLENGE body).
//!
//! What the ingest never decides: admission (Python admits each accepted socket
//! before the ingest reads it: `admit` or `take`), the nonce (the guard's, given with
//! `admit`), authentication, any refusal or error frame. A socket is in exactly one
//! place: waiting for admission, in the ingest's set, or Python's.

use std::collections::{HashMap, VecDeque};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::sync::Mutex;

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use crate::consts::*;
use crate::handshake::{self, Connect};

const EVENTS: usize = 256;

enum Stage {
    /// accepted, Python has not admitted it yet (not in the set)
    Admitting,
    /// admitted: waiting for its CONNECT, with the guard's nonce for the CHALLENGE
    Connecting([u8; NONCE_SIZE]),
    /// CHALLENGE sent: the CONNECT frame taken, and the CHALLENGE's body
    Challenged { nonce: [u8; NONCE_SIZE], connect: Vec<u8>, challenge: Vec<u8> },
}

struct Sock {
    fd: OwnedFd,
    stage: Stage,
    buf: Vec<u8>,
    gen: u64,
}

struct State {
    epfd: OwnedFd,
    listener: i32,
    socks: HashMap<i32, Sock>,
    /// (deadline, fd, gen) in admission order (one timeout for all: deadline order)
    deadlines: VecDeque<(f64, i32, u64)>,
    next_gen: u64,
    max_frame: usize,
    broker_id: Vec<u8>,
    accept_max: usize,
}

/// Ingest(listener_fd, preauth_max_frame, broker_id, accept_max): a plain
/// listener's handshakes up to the AUTH (see ingest.rs and broker/ingest.py).
#[pyclass(name = "Ingest", module = "lockmq._core", frozen)]
pub struct Ingest(Mutex<State>);

fn os_error() -> PyErr {
    let e = std::io::Error::last_os_error();
    PyOSError::new_err((e.raw_os_error().unwrap_or(5), e.to_string()))
}

fn epoll_ctl(epfd: i32, op: i32, fd: i32) -> PyResult<()> {
    let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: fd as u64 };
    // SAFETY: a plain system call on an epoll fd the ingest owns, with a valid event.
    if unsafe { libc::epoll_ctl(epfd, op, fd, &mut ev) } < 0 {
        return Err(os_error());
    }
    Ok(())
}

/// The peer's (ip, port) as Python's getpeername gives them.
fn peer_of(sa: &libc::sockaddr_storage) -> (String, u16) {
    match sa.ss_family as i32 {
        libc::AF_INET => {
            // SAFETY: the kernel wrote a sockaddr_in for an AF_INET peer.
            let a = unsafe { &*(sa as *const _ as *const libc::sockaddr_in) };
            (Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)).to_string(), u16::from_be(a.sin_port))
        }
        libc::AF_INET6 => {
            // SAFETY: the kernel wrote a sockaddr_in6 for an AF_INET6 peer.
            let a = unsafe { &*(sa as *const _ as *const libc::sockaddr_in6) };
            (Ipv6Addr::from(a.sin6_addr.s6_addr).to_string(), u16::from_be(a.sin6_port))
        }
        _ => (String::new(), 0),
    }
}

fn wall_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl State {
    /// fd leaves the ingest: (fd, stage, bytes read, session so far, unsent CHALLENGE
    /// bytes) for Python, who owns the fd from here on (`expired`: its deadline passed).
    fn give_back<'py>(&mut self, py: Python<'py>, fd: i32, unsent: &[u8], expired: bool) -> PyResult<Bound<'py, PyAny>> {
        let s = self.socks.remove(&fd).expect("give_back of a socket in the ingest");
        if !matches!(s.stage, Stage::Admitting) {
            let _ = epoll_ctl(self.epfd.as_raw_fd(), libc::EPOLL_CTL_DEL, fd);
        }
        let raw = s.fd.into_raw_fd();
        let session = match &s.stage {
            Stage::Challenged { nonce, connect, challenge } => Some((
                PyBytes::new(py, nonce),
                PyBytes::new(py, connect),
                PyBytes::new(py, challenge),
            )),
            _ => None,
        };
        let item = (raw, PyBytes::new(py, &s.buf), session, PyBytes::new(py, unsent), expired);
        Ok(item.into_pyobject(py)?.into_any())
    }

    /// Read fd once and act on what it sent: None while it stays, else why it leaves
    /// (the CHALLENGE bytes it did not take, if any).
    fn read(&mut self, fd: i32, rbuf: &mut [u8]) -> Option<Vec<u8>> {
        let (max_frame, broker_id) = (self.max_frame, &self.broker_id);
        let s = self.socks.get_mut(&fd)?;
        let room = (max_frame + 1).saturating_sub(s.buf.len()).min(rbuf.len());
        // SAFETY: recv writes at most `room` bytes into rbuf.
        let r = unsafe { libc::recv(fd, rbuf.as_mut_ptr().cast(), room, 0) };
        if r < 0 {
            let errno = std::io::Error::last_os_error().raw_os_error();
            if matches!(errno, Some(libc::EAGAIN) | Some(libc::EINTR)) {
                return None;
            }
        }
        if r <= 0 {
            return Some(Vec::new()); // EOF or an error: the transport reads it again
        }
        s.buf.extend_from_slice(&rbuf[..r as usize]);
        let Stage::Connecting(nonce) = &s.stage else {
            return Some(Vec::new()); // the AUTH (or whatever follows the CHALLENGE)
        };
        let c = match handshake::lock_connect(&s.buf, max_frame as isize) {
            Connect::Partial => return None,
            Connect::Other => return Some(Vec::new()),
            Connect::Lock(c) => c,
        };
        let nonce = *nonce;
        let (frame, body) = handshake::challenge_frame(&c, &nonce, wall_ms(), broker_id);
        let connect = std::mem::take(&mut s.buf);
        s.stage = Stage::Challenged { nonce, connect, challenge: body };
        // SAFETY: send reads frame.len() bytes of frame.
        let w = unsafe { libc::send(fd, frame.as_ptr().cast(), frame.len(), libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
        let sent = w.max(0) as usize;
        if sent < frame.len() {
            return Some(frame[sent..].to_vec()); // Python writes the rest
        }
        None
    }
}

#[pymethods]
impl Ingest {
    #[new]
    fn new(listener_fd: i32, max_frame: isize, broker_id: &str, accept_max: usize) -> PyResult<Ingest> {
        if max_frame < MIN_FRAME as isize || max_frame > 1 << 20 || accept_max == 0 {
            return Err(PyValueError::new_err("max_frame or accept_max out of range"));
        }
        if !handshake::broker_id_fits(broker_id.as_bytes()) {
            return Err(PyValueError::new_err("broker_id longer than 255 bytes"));
        }
        // SAFETY: a plain system call; the new fd is owned from here on.
        let epfd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if epfd < 0 {
            return Err(os_error());
        }
        let epfd = unsafe { OwnedFd::from_raw_fd(epfd) };
        epoll_ctl(epfd.as_raw_fd(), libc::EPOLL_CTL_ADD, listener_fd)?;
        Ok(Ingest(Mutex::new(State {
            epfd,
            listener: listener_fd,
            socks: HashMap::new(),
            deadlines: VecDeque::new(),
            next_gen: 1,
            max_frame: max_frame as usize,
            broker_id: broker_id.as_bytes().to_vec(),
            accept_max,
        })))
    }

    /// The epoll fd the loop watches (the listener and every socket in a handshake).
    fn fileno(&self) -> i32 {
        self.0.lock().unwrap().epfd.as_raw_fd()
    }

    /// poll(now) -> (accepted, back)
    ///
    /// `accepted`: (fd, ip, port) of each new socket, for Python to admit (`admit`) or
    /// take (`take`) before the next poll. `back`: (fd, data, session, unsent, expired)
    /// of each socket given to Python: `data` the bytes it sent that Python must read
    /// first; `session` None (nothing served: Python's session starts from scratch) or
    /// (nonce, CONNECT frame, CHALLENGE body) of the CHALLENGE sent; `unsent` the end
    /// of that CHALLENGE the socket did not take; `expired` the handshake deadline
    /// (monotonic `now`) passed.
    fn poll<'py>(&self, py: Python<'py>, now: f64) -> PyResult<(Bound<'py, PyList>, Bound<'py, PyList>)> {
        let mut st = self.0.lock().unwrap();
        let accepted = PyList::empty(py);
        let back = PyList::empty(py);
        let mut ev = [libc::epoll_event { events: 0, u64: 0 }; EVENTS];
        // SAFETY: epoll_wait writes at most EVENTS events into `ev`.
        let k = unsafe { libc::epoll_wait(st.epfd.as_raw_fd(), ev.as_mut_ptr(), EVENTS as i32, 0) };
        if k < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return Err(os_error());
        }
        let mut rbuf = vec![0u8; st.max_frame + 1];
        for e in ev.iter().take(k.max(0) as usize) {
            let fd = e.u64 as i32;
            if fd == st.listener {
                for _ in 0..st.accept_max {
                    let mut sa: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
                    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
                    // SAFETY: accept4 writes at most `len` bytes of the peer's address.
                    let c = unsafe {
                        libc::accept4(st.listener, &mut sa as *mut _ as *mut libc::sockaddr, &mut len, libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC)
                    };
                    if c < 0 {
                        break; // EAGAIN; or an error of one connection (ECONNABORTED ...): the next poll
                    }
                    let (ip, port) = peer_of(&sa);
                    let gen = st.next_gen;
                    st.next_gen += 1;
                    // SAFETY: accept4 returned a new fd, owned from here on.
                    let owned = unsafe { OwnedFd::from_raw_fd(c) };
                    st.socks.insert(c, Sock { fd: owned, stage: Stage::Admitting, buf: Vec::new(), gen });
                    accepted.append((c, ip, port))?;
                }
                continue;
            }
            if !st.socks.get(&fd).is_some_and(|s| !matches!(s.stage, Stage::Admitting)) {
                continue;
            }
            if let Some(unsent) = st.read(fd, &mut rbuf) {
                back.append(st.give_back(py, fd, &unsent, false)?)?;
            }
        }
        while let Some(&(deadline, fd, gen)) = st.deadlines.front() {
            if deadline > now {
                break;
            }
            st.deadlines.pop_front();
            if st.socks.get(&fd).is_some_and(|s| s.gen == gen) {
                back.append(st.give_back(py, fd, &[], true)?)?;
            }
        }
        Ok((accepted, back))
    }

    /// admit(fd, nonce, deadline): Python admitted fd; read its CONNECT from now on
    /// (the CHALLENGE carries `nonce`, the guard's; at `deadline`, monotonic, poll
    /// gives it back expired: the deadlines are acted on in admission order).
    fn admit(&self, fd: i32, nonce: &[u8], deadline: f64) -> PyResult<()> {
        let mut st = self.0.lock().unwrap();
        let nonce: [u8; NONCE_SIZE] = nonce.try_into().map_err(|_| PyValueError::new_err("nonce of NONCE_SIZE bytes"))?;
        let epfd = st.epfd.as_raw_fd();
        let Some(s) = st.socks.get_mut(&fd).filter(|s| matches!(s.stage, Stage::Admitting)) else {
            return Err(PyValueError::new_err("fd is not waiting for admission"));
        };
        s.stage = Stage::Connecting(nonce);
        let gen = s.gen;
        epoll_ctl(epfd, libc::EPOLL_CTL_ADD, fd)?;
        st.deadlines.push_back((deadline, fd, gen));
        Ok(())
    }

    /// take(fd) -> fd: Python takes a socket the ingest holds (refused at admission, or
    /// the broker closing); None if it is not the ingest's.
    fn take(&self, fd: i32) -> Option<i32> {
        let mut st = self.0.lock().unwrap();
        let s = st.socks.remove(&fd)?;
        if !matches!(s.stage, Stage::Admitting) {
            let _ = epoll_ctl(st.epfd.as_raw_fd(), libc::EPOLL_CTL_DEL, fd);
        }
        Some(s.fd.into_raw_fd())
    }

    /// How many sockets the ingest holds (admitted or not).
    fn pending(&self) -> usize {
        self.0.lock().unwrap().socks.len()
    }

    /// The earliest handshake deadline of a socket still held (monotonic), or None.
    fn next_deadline(&self) -> Option<f64> {
        let st = self.0.lock().unwrap();
        st.deadlines.iter().find(|(_, fd, gen)| st.socks.get(fd).is_some_and(|s| s.gen == *gen)).map(|d| d.0)
    }

    /// Close every socket held (the broker is stopping: no answers).
    fn close(&self) {
        let mut st = self.0.lock().unwrap();
        let epfd = st.epfd.as_raw_fd();
        for (fd, s) in st.socks.drain() {
            if !matches!(s.stage, Stage::Admitting) {
                let _ = epoll_ctl(epfd, libc::EPOLL_CTL_DEL, fd);
            }
        }
        st.deadlines.clear();
        let listener = st.listener;
        let _ = epoll_ctl(epfd, libc::EPOLL_CTL_DEL, listener);
    }
}

/// serve_connect(data, max_frame, nonce, server_time_ms, broker_id) -> None |
/// (challenge_frame, challenge_body, transcript): what the ingest answers a socket
/// that sent `data` (the tests hold it to protocol/_server_session.py).
#[pyfunction]
pub fn serve_connect<'py>(
    py: Python<'py>,
    data: &[u8],
    max_frame: isize,
    nonce: &[u8],
    server_time_ms: u64,
    broker_id: &str,
) -> PyResult<Option<(Bound<'py, PyBytes>, Bound<'py, PyBytes>, Bound<'py, PyBytes>)>> {
    let nonce: [u8; NONCE_SIZE] = nonce.try_into().map_err(|_| PyValueError::new_err("nonce of NONCE_SIZE bytes"))?;
    let Connect::Lock(c) = handshake::lock_connect(data, max_frame) else { return Ok(None) };
    let (frame, body) = handshake::challenge_frame(&c, &nonce, server_time_ms, broker_id.as_bytes());
    let t = handshake::transcript(c.sn, 0, c.body, &body);
    Ok(Some((PyBytes::new(py, &frame), PyBytes::new(py, &body), PyBytes::new(py, &t))))
}
