//! HTTP/1.x message framing (RFC 9112), the one implementation for preheat's proxy and clients:
//! where a message's head ends, and how long its body is.
//!
//! * Heads are parsed by [`httparse`] ([`request_head`], [`response_head`]), which also settles
//!   the body's framing ([`Body`]): none, `Content-Length`, the `chunked` transfer coding, or (a
//!   response only) until the connection closes.
//! * Bodies are framed by a streaming [`BodyReader`]: feed it bytes as they arrive; it says how
//!   many belong to the body, which of them are payload (chunked bodies decoded in place), and
//!   when the body ends. It never buffers more than one chunk-size or trailer line, so large
//!   bodies flow through.
//! * [`request_len`] and [`response_len`] frame a whole message at the start of a buffer.
//!
//! Requests are framed strictly, as a proxy must (no request smuggling): both `Content-Length`
//! and `Transfer-Encoding`, differing `Content-Length` values, or a final transfer coding other
//! than `chunked` are [`Error::Malformed`]. Responses follow RFC 9112 §6.3: `Transfer-Encoding`
//! overrides `Content-Length`, and a response without either runs until the connection closes.
//! Pure: no I/O, never panics on input.
#![forbid(unsafe_code)]

use std::fmt;
use std::ops::Range;

/// Why a message could not be framed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// Over a size bound (`what` says which).
    TooLarge(&'static str),
    /// Not a valid HTTP/1.x message, or framing that cannot be trusted.
    Malformed(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::TooLarge(what) => write!(f, "{what} too large"),
            Error::Malformed(why) => write!(f, "malformed HTTP message: {why}"),
        }
    }
}

impl std::error::Error for Error {}

fn malformed(why: impl Into<String>) -> Error {
    Error::Malformed(why.into())
}

/// How a message's body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    /// No body.
    None,
    /// `Content-Length` bytes.
    Length(u64),
    /// The `chunked` transfer coding: chunks, a last chunk, trailer fields, an empty line.
    Chunked,
    /// Everything until the peer closes the connection (a response without a length).
    UntilClose,
}

/// A complete request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    /// Bytes of the head (request line and header fields, up to and including the empty line;
    /// empty lines before the request line included).
    pub len: usize,
    pub method: String,
    /// An `Upgrade` header field: the stream may stop being HTTP after this request.
    pub upgrade: bool,
    pub body: Body,
}

/// A complete response head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    /// Bytes of the head (status line and header fields, up to and including the empty line).
    pub len: usize,
    pub status: u16,
    /// The server closes the connection after this response (HTTP/1.0 without keep-alive,
    /// `Connection: close`, or a body that runs until the close).
    pub close: bool,
    pub body: Body,
}

/// Size bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest head (start line and header fields).
    pub max_head: usize,
    /// Longest chunk-size or trailer line (with its line end).
    pub max_line: usize,
    /// Largest whole message: head plus body as framed on the wire ([`request_len`],
    /// [`response_len`]).
    pub max_message: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_head: 64 * 1024,
            max_line: 64 * 1024,
            max_message: 8 * 1024 * 1024,
        }
    }
}

/// Header fields tried first; a head with more is parsed again with room for as many as its
/// size allows (a field takes at least 3 bytes: `a:` and a line end).
const FIRST_HEADERS: usize = 64;

/// Runs `parse` with room for `FIRST_HEADERS` fields, then for as many as `len` bytes can hold.
fn with_headers<'b, T>(
    len: usize,
    mut parse: impl FnMut(&mut [httparse::Header<'b>]) -> Result<T, httparse::Error>,
) -> Result<T, httparse::Error> {
    let mut headers = [httparse::EMPTY_HEADER; FIRST_HEADERS];
    match parse(&mut headers) {
        Err(httparse::Error::TooManyHeaders) if len / 3 > FIRST_HEADERS => {
            parse(&mut vec![httparse::EMPTY_HEADER; len / 3 + 1])
        }
        r => r,
    }
}

/// The framing fields of a head.
#[derive(Default)]
struct Fields {
    content_length: Option<u64>,
    /// Transfer codings in order, over every `Transfer-Encoding` field.
    codings: Vec<String>,
    upgrade: bool,
    close: bool,
    keep_alive: bool,
}

impl Fields {
    fn read(headers: &[httparse::Header<'_>]) -> Result<Fields, Error> {
        let mut f = Fields::default();
        for h in headers {
            let value = std::str::from_utf8(h.value).unwrap_or("");
            if h.name.eq_ignore_ascii_case("content-length") {
                for v in value.split(',').map(str::trim) {
                    let n = parse_dec(v).ok_or_else(|| malformed("invalid Content-Length"))?;
                    if f.content_length.is_some_and(|c| c != n) {
                        return Err(malformed("conflicting Content-Length values"));
                    }
                    f.content_length = Some(n);
                }
            } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                f.codings.extend(
                    value
                        .split(',')
                        .map(|c| c.trim().to_ascii_lowercase())
                        .filter(|c| !c.is_empty()),
                );
            } else if h.name.eq_ignore_ascii_case("upgrade") {
                f.upgrade = true;
            } else if h.name.eq_ignore_ascii_case("connection") {
                for token in value.split(',').map(str::trim) {
                    f.close |= token.eq_ignore_ascii_case("close");
                    f.keep_alive |= token.eq_ignore_ascii_case("keep-alive");
                }
            }
        }
        Ok(f)
    }

    fn has_transfer_encoding(&self) -> bool {
        !self.codings.is_empty()
    }

    fn chunked_last(&self) -> bool {
        self.codings.last().is_some_and(|c| c == "chunked")
    }
}

/// A decimal `Content-Length` (digits only, at most 19 of them).
fn parse_dec(text: &str) -> Option<u64> {
    if text.is_empty() || text.len() > 19 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// `head` is an incomplete head: an error once it reached `max_head` bytes.
fn partial<T>(buf_len: usize, max_head: usize, what: &'static str) -> Result<Option<T>, Error> {
    if buf_len >= max_head {
        Err(Error::TooLarge(what))
    } else {
        Ok(None)
    }
}

/// Parses the request head at the start of `buf`: `None` while it is incomplete.
///
/// Refuses framing a proxy must not guess about ([`Error::Malformed`]): both `Content-Length`
/// and `Transfer-Encoding`, differing `Content-Length` values, a final transfer coding other
/// than `chunked`; httparse refuses obsolete line folding, whitespace before a header colon and
/// versions other than HTTP/1.0 and 1.1.
pub fn request_head(buf: &[u8], max_head: usize) -> Result<Option<RequestHead>, Error> {
    let window = &buf[..buf.len().min(max_head)];
    let parsed = with_headers(window.len(), |headers| {
        let mut req = httparse::Request::new(headers);
        Ok(match req.parse(window)? {
            httparse::Status::Complete(len) => Some((
                len,
                req.method.unwrap_or("").to_string(),
                Fields::read(req.headers),
            )),
            httparse::Status::Partial => None,
        })
    })
    .map_err(|e| malformed(format!("request head: {e}")))?;
    let Some((len, method, fields)) = parsed else {
        return partial(window.len(), max_head, "request head");
    };
    let fields = fields?;
    let body = if fields.has_transfer_encoding() {
        if fields.content_length.is_some() {
            return Err(malformed("both Content-Length and Transfer-Encoding"));
        }
        if !fields.chunked_last() {
            return Err(malformed("final transfer coding is not chunked"));
        }
        Body::Chunked
    } else {
        match fields.content_length {
            None | Some(0) => Body::None,
            Some(n) => Body::Length(n),
        }
    };
    Ok(Some(RequestHead {
        len,
        method,
        upgrade: fields.upgrade,
        body,
    }))
}

/// Parses the response head at the start of `buf`: `None` while it is incomplete.
/// `to_head_request`: the response answers a `HEAD` request (no body whatever the fields say).
/// Interim (1xx), 204 and 304 responses have no body. A `Content-Length` that is invalid or
/// conflicts with another is [`Error::Malformed`].
pub fn response_head(
    buf: &[u8],
    to_head_request: bool,
    max_head: usize,
) -> Result<Option<ResponseHead>, Error> {
    let window = &buf[..buf.len().min(max_head)];
    let parsed = with_headers(window.len(), |headers| {
        let mut resp = httparse::Response::new(headers);
        Ok(match resp.parse(window)? {
            httparse::Status::Complete(len) => Some((
                len,
                resp.code.unwrap_or(0),
                resp.version.unwrap_or(1),
                Fields::read(resp.headers),
            )),
            httparse::Status::Partial => None,
        })
    })
    .map_err(|e| malformed(format!("response head: {e}")))?;
    let Some((len, status, minor, fields)) = parsed else {
        return partial(window.len(), max_head, "response head");
    };
    let fields = fields?;
    let mut close = fields.close || (minor == 0 && !fields.keep_alive);
    let body = if to_head_request || (100..200).contains(&status) || status == 204 || status == 304
    {
        Body::None
    } else if fields.has_transfer_encoding() {
        if fields.chunked_last() {
            Body::Chunked
        } else {
            Body::UntilClose
        }
    } else {
        match fields.content_length {
            Some(0) => Body::None,
            Some(n) => Body::Length(n),
            None => Body::UntilClose,
        }
    };
    close |= body == Body::UntilClose;
    Ok(Some(ResponseHead {
        len,
        status,
        close,
        body,
    }))
}

/// What one [`BodyReader::advance`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// Bytes of the input that belong to the body (framing included).
    pub consumed: usize,
    /// The payload among them, as a range of the input (empty if none).
    pub payload: Range<usize>,
    /// The body is complete (the input from `consumed` on is the next message).
    pub done: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Payload bytes left (Content-Length, or the rest of a chunk).
    Data {
        left: u64,
        chunk: bool,
    },
    ChunkSize,
    /// The line end after a chunk's data.
    ChunkEnd,
    Trailers,
    UntilClose,
    Done,
}

/// Streaming body framer for one message (see the module docs).
#[derive(Debug, Clone)]
pub struct BodyReader {
    state: State,
    /// A chunk-size, chunk-end or trailer line read so far (without its line end).
    line: Vec<u8>,
    max_line: usize,
}

impl BodyReader {
    /// A reader for a body framed as `body`; chunk-size and trailer lines are bounded by
    /// `max_line` bytes.
    pub fn new(body: Body, max_line: usize) -> BodyReader {
        let state = match body {
            Body::None | Body::Length(0) => State::Done,
            Body::Length(n) => State::Data {
                left: n,
                chunk: false,
            },
            Body::Chunked => State::ChunkSize,
            Body::UntilClose => State::UntilClose,
        };
        BodyReader {
            state,
            line: Vec::new(),
            max_line,
        }
    }

    /// Whether the body is complete.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// The peer closed the connection: completes a body that runs until the close. Returns
    /// whether the body is complete now.
    pub fn eof(&mut self) -> bool {
        if self.state == State::UntilClose {
            self.state = State::Done;
        }
        self.is_done()
    }

    /// Consumes body bytes from `data` up to the first payload run, or the end of the body, or
    /// the end of `data`. Call again with the rest while `consumed < data.len()` and not done.
    pub fn advance(&mut self, data: &[u8]) -> Result<Step, Error> {
        let mut i = 0;
        loop {
            match self.state {
                State::Done => {
                    return Ok(Step {
                        consumed: i,
                        payload: i..i,
                        done: true,
                    })
                }
                State::UntilClose => {
                    return Ok(Step {
                        consumed: data.len(),
                        payload: i..data.len(),
                        done: false,
                    })
                }
                State::Data { left, chunk } => {
                    let n = left.min((data.len() - i) as u64);
                    let start = i;
                    i += n as usize;
                    let left = left - n;
                    self.state = match (left, chunk) {
                        (0, false) => State::Done,
                        (0, true) => State::ChunkEnd,
                        _ => State::Data { left, chunk },
                    };
                    if n > 0 || i == data.len() {
                        return Ok(Step {
                            consumed: i,
                            payload: start..i,
                            done: self.state == State::Done,
                        });
                    }
                }
                State::ChunkSize | State::ChunkEnd | State::Trailers => {
                    let Some(line_len) = self.take_line(&data[i..])? else {
                        return Ok(Step {
                            consumed: data.len(),
                            payload: data.len()..data.len(),
                            done: false,
                        });
                    };
                    i += line_len;
                    let line = std::mem::take(&mut self.line);
                    self.state = self.after_line(&line)?;
                    self.line = line;
                    self.line.clear();
                }
            }
        }
    }

    /// Appends `data` up to the first line end to the line buffer; `Some(bytes used)` once the
    /// line is complete (`self.line` then holds it without its line end).
    fn take_line(&mut self, data: &[u8]) -> Result<Option<usize>, Error> {
        let nl = data.iter().position(|&b| b == b'\n');
        let part = &data[..nl.unwrap_or(data.len())];
        if self.line.len() + part.len() + nl.map_or(0, |_| 1) > self.max_line {
            return Err(Error::TooLarge(match self.state {
                State::Trailers => "trailer line",
                _ => "chunk line",
            }));
        }
        self.line.extend_from_slice(part);
        if self.state == State::ChunkEnd && !matches!(&self.line[..], b"" | b"\r") {
            return Err(malformed("chunk data not followed by CRLF"));
        }
        let Some(nl) = nl else {
            return Ok(None);
        };
        if self.line.last() == Some(&b'\r') {
            self.line.pop();
        }
        Ok(Some(nl + 1))
    }

    fn after_line(&self, line: &[u8]) -> Result<State, Error> {
        Ok(match self.state {
            State::ChunkSize => {
                // httparse wants the CRLF; bare LF line ends are accepted here as elsewhere.
                let mut text = line.to_vec();
                text.extend_from_slice(b"\r\n");
                match httparse::parse_chunk_size(&text) {
                    Ok(httparse::Status::Complete((_, 0))) => State::Trailers,
                    Ok(httparse::Status::Complete((_, n))) => State::Data {
                        left: n,
                        chunk: true,
                    },
                    _ => return Err(malformed("invalid chunk size")),
                }
            }
            State::ChunkEnd if line.is_empty() => State::ChunkSize,
            State::ChunkEnd => return Err(malformed("chunk data not followed by CRLF")),
            State::Trailers if line.is_empty() => State::Done,
            other => other,
        })
    }
}

/// Frames a whole body at the start of `buf`: `Some(bytes)` once complete (never for
/// [`Body::UntilClose`]). `payload` receives the payload runs (decoded chunks).
fn body_len(
    body: Body,
    buf: &[u8],
    limits: &Limits,
    mut payload: impl FnMut(&[u8]),
) -> Result<Option<usize>, Error> {
    let mut reader = BodyReader::new(body, limits.max_line);
    let mut off = 0;
    loop {
        let step = reader.advance(&buf[off..])?;
        payload(&buf[off..][step.payload]);
        off += step.consumed;
        if step.done {
            return Ok(Some(off));
        }
        if off == buf.len() {
            return Ok(None);
        }
    }
}

/// A whole message: its head and how many bytes it occupies (head and body as framed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Framed<H> {
    pub head: H,
    pub len: usize,
}

/// The bound on a whole message: a declared length over it is refused at once, a chunked body
/// as soon as the buffer holds more than it without the body's end.
fn check_total(head_len: usize, body: Body, buf_len: usize, limits: &Limits) -> Result<(), Error> {
    let declared = match body {
        Body::Length(n) => n,
        _ => 0,
    };
    if (head_len as u64).saturating_add(declared) > limits.max_message
        || (body == Body::Chunked && buf_len as u64 > limits.max_message)
    {
        return Err(Error::TooLarge("message"));
    }
    Ok(())
}

/// The first complete request in `buf` and its length; `None` while incomplete.
pub fn request_len(buf: &[u8], limits: &Limits) -> Result<Option<Framed<RequestHead>>, Error> {
    let Some(head) = request_head(buf, limits.max_head)? else {
        return Ok(None);
    };
    check_total(head.len, head.body, buf.len(), limits)?;
    let body = body_len(head.body, &buf[head.len..], limits, |_| {})?;
    match body {
        Some(n) if (head.len + n) as u64 > limits.max_message => Err(Error::TooLarge("message")),
        Some(n) => Ok(Some(Framed {
            len: head.len + n,
            head,
        })),
        None => Ok(None),
    }
}

/// A whole response and its payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FramedResponse {
    pub head: ResponseHead,
    /// Bytes the response occupies (head and body as framed).
    pub len: usize,
    /// The body's payload (chunks decoded).
    pub payload: Vec<u8>,
}

/// The first complete response in `buf`; `None` while incomplete, and always for a response
/// that runs until the connection closes (the caller has the whole buffer then: its head is
/// [`response_head`]'s).
pub fn response_len(
    buf: &[u8],
    to_head_request: bool,
    limits: &Limits,
) -> Result<Option<FramedResponse>, Error> {
    let Some(head) = response_head(buf, to_head_request, limits.max_head)? else {
        return Ok(None);
    };
    check_total(head.len, head.body, buf.len(), limits)?;
    let mut payload = Vec::new();
    let body = body_len(head.body, &buf[head.len..], limits, |p| {
        payload.extend_from_slice(p)
    })?;
    Ok(body.map(|n| FramedResponse {
        len: head.len + n,
        head,
        payload,
    }))
}

#[cfg(test)]
mod tests;
