//! A deadline on HTTP/2 request headers, which hyper has only for HTTP/1.
//!
//! An HTTP/2 connection could hold its file descriptor (and its place under
//! `--max-connections`) for as long as a client liked without ever making a
//! request: by never sending the connection preface (hyper waits for it
//! without a timeout, and sends no keep-alive ping before it), or by opening
//! a header block and finishing it slowly or never (a client in the middle of
//! one cannot answer pings, so only the 40 s keep-alive ended it). A legitimate
//! client sends the preface as soon as it connects and each header block in
//! one go; this wrapper watches the frame boundaries of what the server reads
//! and fails the read, which ends the connection, when either takes longer
//! than [`HEADER_TIMEOUT`].

use std::{
    io,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    time::Sleep,
};

/// How long a connection has to send the HTTP/2 preface, and each request's
/// header block once it has begun: as long as the status page's and the
/// metrics endpoint's header-read timeout.
pub const HEADER_TIMEOUT: Duration = outbox_runtime::http::HEADER_READ_TIMEOUT;

/// The client's connection preface (RFC 9113, 3.4).
const PREFACE_LEN: usize = 24;
const FRAME_HEADER_LEN: usize = 9;
const HEADERS: u8 = 0x1;
const PUSH_PROMISE: u8 = 0x5;
const CONTINUATION: u8 = 0x9;
const END_HEADERS: u8 = 0x4;

/// Where in the client's byte stream the reader is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum At {
    Preface { left: usize },
    FrameHeader { have: usize },
    Payload { left: usize, ends_block: bool },
}

/// The frame boundaries of what a server reads, and whether the client owes
/// the end of something (the preface, or a header block) it has begun.
#[derive(Debug)]
struct Frames {
    at: At,
    header: [u8; FRAME_HEADER_LEN],
    in_block: bool,
}

impl Frames {
    fn new() -> Self {
        Self {
            at: At::Preface { left: PREFACE_LEN },
            header: [0; FRAME_HEADER_LEN],
            in_block: false,
        }
    }

    /// Whether the client owes the rest of the preface or of a header block.
    fn owes(&self) -> bool {
        self.in_block || matches!(self.at, At::Preface { .. })
    }

    fn read(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            match self.at {
                At::Preface { left } => {
                    let n = left.min(bytes.len());
                    bytes = &bytes[n..];
                    self.at = match left - n {
                        0 => At::FrameHeader { have: 0 },
                        left => At::Preface { left },
                    };
                }
                At::FrameHeader { have } => {
                    let n = (FRAME_HEADER_LEN - have).min(bytes.len());
                    self.header[have..have + n].copy_from_slice(&bytes[..n]);
                    bytes = &bytes[n..];
                    if have + n < FRAME_HEADER_LEN {
                        self.at = At::FrameHeader { have: have + n };
                        continue;
                    }
                    let [l0, l1, l2, kind, flags, ..] = self.header;
                    let len = usize::from(l0) << 16 | usize::from(l1) << 8 | usize::from(l2);
                    let block = matches!(kind, HEADERS | PUSH_PROMISE | CONTINUATION);
                    if matches!(kind, HEADERS | PUSH_PROMISE) {
                        self.in_block = true;
                    }
                    self.at = At::Payload {
                        left: len,
                        ends_block: block && flags & END_HEADERS != 0,
                    };
                    self.end_of_payload();
                }
                At::Payload { left, ends_block } => {
                    let n = left.min(bytes.len());
                    bytes = &bytes[n..];
                    self.at = At::Payload {
                        left: left - n,
                        ends_block,
                    };
                    self.end_of_payload();
                }
            }
        }
    }

    /// A frame read whole: the next one's header follows, and a frame with
    /// END_HEADERS has ended the header block.
    fn end_of_payload(&mut self) {
        if let At::Payload {
            left: 0,
            ends_block,
        } = self.at
        {
            if ends_block {
                self.in_block = false;
            }
            self.at = At::FrameHeader { have: 0 };
        }
    }
}

/// A server-side HTTP/2 connection whose reads fail with `TimedOut` once
/// the client has owed the end of its preface or of a header block for
/// [`HEADER_TIMEOUT`].
pub struct HeaderDeadline<IO> {
    io: IO,
    frames: Frames,
    /// Armed while the client owes something.
    deadline: Option<Pin<Box<Sleep>>>,
}

impl<IO> HeaderDeadline<IO> {
    pub fn new(io: IO) -> Self {
        Self {
            io,
            frames: Frames::new(),
            deadline: Some(Box::pin(tokio::time::sleep(HEADER_TIMEOUT))),
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for HeaderDeadline<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let read = Pin::new(&mut this.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = read {
            this.frames.read(&buf.filled()[before..]);
            match (this.frames.owes(), &mut this.deadline) {
                (false, deadline) => *deadline = None,
                (true, None) => {
                    this.deadline = Some(Box::pin(tokio::time::sleep(HEADER_TIMEOUT)));
                }
                (true, Some(_)) => {}
            }
        }
        // Polled whenever the read is, so its waker is the reader's: a
        // client that sends nothing more is still timed out.
        if let Some(deadline) = &mut this.deadline
            && deadline.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no complete HTTP/2 preface or request header within {HEADER_TIMEOUT:?}"),
            )));
        }
        read
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for HeaderDeadline<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// Handlers see the connection as without the deadline.
impl<IO: tonic::transport::server::Connected> tonic::transport::server::Connected
    for HeaderDeadline<IO>
{
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        let len = u32::try_from(payload.len()).expect("small");
        let mut out = len.to_be_bytes()[1..].to_vec();
        out.extend_from_slice(&[kind, flags, 0, 0, 0, 1]);
        out.extend_from_slice(payload);
        out
    }

    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

    #[test]
    fn a_header_block_is_owed_from_its_first_frame_to_end_headers() {
        let mut frames = Frames::new();
        assert!(frames.owes(), "the preface is owed from the start");
        frames.read(&PREFACE[..10]);
        assert!(frames.owes());
        frames.read(&PREFACE[10..]);
        frames.read(&frame(0x4, 0, &[])); // SETTINGS
        assert!(!frames.owes(), "nothing owed between requests");

        let headers = frame(HEADERS, 0, &[0x83; 100]);
        frames.read(&headers[..5]);
        assert!(!frames.owes(), "not before the frame's header is whole");
        frames.read(&headers[5..]);
        assert!(frames.owes(), "HEADERS without END_HEADERS opens a block");
        frames.read(&frame(CONTINUATION, 0, &[0; 50]));
        assert!(frames.owes());
        let last = frame(CONTINUATION, END_HEADERS, &[0; 50]);
        frames.read(&last[..20]);
        assert!(
            frames.owes(),
            "until the END_HEADERS frame's payload is read"
        );
        frames.read(&last[20..]);
        assert!(!frames.owes());

        // A whole block in one frame, bytes one at a time, then DATA.
        let mut stream = frame(HEADERS, END_HEADERS | 0x1, &[0x83; 30]);
        stream.extend(frame(0x0, 0x1, &[7; 40]));
        for byte in stream {
            frames.read(&[byte]);
        }
        assert!(!frames.owes());
        assert_eq!(frames.at, At::FrameHeader { have: 0 });
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_owes_its_header_too_long_fails_its_read() {
        use tokio::{
            io::{AsyncReadExt as _, AsyncWriteExt as _},
            time::Instant,
        };

        let (client, server) = tokio::io::duplex(64 * 1024);
        let mut server = HeaderDeadline::new(server);
        let (_read, mut write) = tokio::io::split(client);
        let mut prefix = PREFACE.to_vec();
        prefix.extend(frame(HEADERS, 0, &[0x83; 10]));
        write.write_all(&prefix).await.expect("write");
        let mut buf = vec![0u8; 1024];
        let n = server
            .read(&mut buf)
            .await
            .expect("the preface and a frame");
        assert_eq!(n, prefix.len());
        let began = Instant::now();
        let err = server.read(&mut buf).await.expect_err("timed out");
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(began.elapsed() <= HEADER_TIMEOUT);

        // A block completed in time: reads go on for as long as they like.
        let (client, server) = tokio::io::duplex(64 * 1024);
        let mut server = HeaderDeadline::new(server);
        let (_read, mut write) = tokio::io::split(client);
        let mut whole = PREFACE.to_vec();
        whole.extend(frame(HEADERS, END_HEADERS, &[0x83; 10]));
        write.write_all(&whole).await.expect("write");
        let n = server.read(&mut buf).await.expect("read");
        assert_eq!(n, whole.len());
        let later = tokio::time::timeout(HEADER_TIMEOUT * 3, server.read(&mut buf)).await;
        assert!(later.is_err(), "still waiting, not failed: {later:?}");
    }
}
