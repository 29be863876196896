//! A minimal control channel between two workers: JSON values, one per
//! line, over a TCP connection, every read bounded by a timeout. It carries
//! the handshake (and the loopback peer's commands) until the workers speak
//! HTTP to each other.

use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::{DisaggError, Result};

/// How long [`ControlChannel::recv`] waits by default.
pub const DEFAULT_RECV_TIMEOUT: Duration = Duration::from_secs(60);

pub struct ControlChannel {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    line: String,
}

impl ControlChannel {
    pub fn new(stream: TcpStream) -> Result<Self> {
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(DEFAULT_RECV_TIMEOUT))?;
        let writer = stream.try_clone()?;
        Ok(Self { reader: BufReader::new(stream), writer, line: String::new() })
    }

    /// Connects to a listening peer, retrying refused connections until
    /// `timeout` (the peer may still be starting).
    pub fn connect(addr: SocketAddr, timeout: Duration) -> Result<Self> {
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_millis(1);
        loop {
            match TcpStream::connect_timeout(&addr, timeout) {
                Ok(s) => return Self::new(s),
                Err(e) if e.kind() == ErrorKind::ConnectionRefused && Instant::now() + pause < deadline => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Accepts one connection on `listener` within `timeout`. `alive` is
    /// asked between polls so a caller waiting on a child process can stop
    /// as soon as the child has died.
    pub fn accept(listener: &TcpListener, timeout: Duration, mut alive: impl FnMut() -> Result<()>) -> Result<Self> {
        listener.set_nonblocking(true)?;
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_micros(200);
        let stream = loop {
            match listener.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    alive()?;
                    if Instant::now() >= deadline {
                        return Err(DisaggError::Control(format!("no peer connected within {timeout:?}")));
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(20));
                }
                Err(e) => return Err(e.into()),
            }
        };
        listener.set_nonblocking(false)?;
        stream.set_nonblocking(false)?;
        Self::new(stream)
    }

    pub fn set_recv_timeout(&mut self, timeout: Duration) -> Result<()> {
        self.reader.get_ref().set_read_timeout(Some(timeout))?;
        Ok(())
    }

    pub fn send<T: Serialize>(&mut self, msg: &T) -> Result<()> {
        let mut bytes = serde_json::to_vec(msg)?;
        bytes.push(b'\n');
        self.writer.write_all(&bytes)?;
        Ok(())
    }

    /// The next message; a closed connection or an elapsed read timeout is
    /// a [`DisaggError::Control`].
    pub fn recv<T: DeserializeOwned>(&mut self) -> Result<T> {
        self.line.clear();
        match self.reader.read_line(&mut self.line) {
            Ok(0) => Err(DisaggError::Control("the peer closed the connection".into())),
            Ok(_) => Ok(serde_json::from_str(self.line.trim_end())?),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                Err(DisaggError::Control("timed out waiting for the peer".into()))
            }
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Two ends of a channel over 127.0.0.1.
    pub(crate) fn channel_pair() -> (ControlChannel, ControlChannel) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let t = std::thread::spawn(move || ControlChannel::connect(addr, Duration::from_secs(5)).unwrap());
        let a = ControlChannel::accept(&listener, Duration::from_secs(5), || Ok(())).unwrap();
        (a, t.join().unwrap())
    }

    #[test]
    fn messages_arrive_in_order() {
        let (mut a, mut b) = channel_pair();
        a.send(&vec![1, 2]).unwrap();
        a.send(&"three").unwrap();
        assert_eq!(b.recv::<Vec<i32>>().unwrap(), vec![1, 2]);
        assert_eq!(b.recv::<String>().unwrap(), "three");
    }

    #[test]
    fn closed_peer_is_an_error_not_a_hang() {
        let (mut a, b) = channel_pair();
        drop(b);
        assert!(matches!(a.recv::<String>(), Err(DisaggError::Control(_))));
    }

    #[test]
    fn silent_peer_times_out() {
        let (mut a, _b) = channel_pair();
        a.set_recv_timeout(Duration::from_millis(50)).unwrap();
        let err = a.recv::<String>().unwrap_err();
        assert!(err.to_string().contains("timed out"), "{err}");
    }
}
