//! Where one request ends and the next begins, for the two protocols the stage understands.
//!
//! The proxy forwards the client's byte stream unchanged and in order; framing only decides the
//! *cut points*: a request is staged once it is complete, and each response that completes is a
//! sample of the backend's response time. A framing mistake therefore never corrupts traffic: at
//! worst a request is held until the next burst, or a timing sample is lost.
//!
//! * Requests are framed from a buffer ([`memcached_request`], [`http_request`]); the proxy
//!   buffers whole requests anyway (bounded by [`Limits`]).
//! * Responses are framed by a streaming [`ResponseTracker`] that never buffers more than one
//!   memcached line or one HTTP head, so large values and bodies flow straight through.
//!
//! HTTP framing is [`preheat_http`]'s (heads parsed by httparse, bodies by `Content-Length` or
//! chunked transfer coding); this module adds the memcached text protocol.

use std::fmt;

/// How requests and responses are cut on the proxied connections: the wire protocol the stage
/// frames (`--protocol`). Not the lab's server protocols (`preheat_lab::driver`), of which it
/// frames two.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Framing {
    /// HTTP/1.1 (requests framed by headers, Content-Length or chunked bodies).
    Http,
    /// memcached text protocol (command lines, storage data blocks, meta commands).
    Memcached,
}

impl fmt::Display for Framing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Framing::Http => "http",
            Framing::Memcached => "memcached",
        })
    }
}

/// Size limits for buffered requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest memcached command line, HTTP chunk-size or trailer line (bytes, with newline).
    pub max_line: usize,
    /// Longest HTTP request head (request line + headers).
    pub max_header: usize,
    /// Largest whole request (line or head plus body/data block).
    pub max_request: usize,
}

impl Default for Limits {
    /// [`preheat_http::Limits`]'s defaults, for both protocols.
    fn default() -> Self {
        let http = preheat_http::Limits::default();
        Limits {
            max_line: http.max_line,
            max_header: http.max_head,
            max_request: http.max_message as usize,
        }
    }
}

impl Limits {
    fn http(&self) -> preheat_http::Limits {
        preheat_http::Limits {
            max_head: self.max_header,
            max_line: self.max_line,
            max_message: self.max_request as u64,
        }
    }
}

/// One complete request at the start of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestFrame {
    /// Bytes the request occupies.
    pub len: usize,
    /// Whether the backend answers it (memcached `noreply`, `quit` and quiet meta commands do
    /// not).
    pub expects_response: bool,
    /// HTTP `HEAD`: the response carries no body.
    pub head: bool,
    /// After this request the stream is no longer framed (HTTP `Upgrade` or `CONNECT`).
    pub opaque_after: bool,
}

impl RequestFrame {
    fn simple(len: usize, expects_response: bool) -> RequestFrame {
        RequestFrame {
            len,
            expects_response,
            head: false,
            opaque_after: false,
        }
    }
}

/// Why a request could not be framed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// Over a [`Limits`] bound (the client gets an error reply and the connection closes).
    TooLarge(&'static str),
    /// Not a valid request, or ambiguous framing a proxy must refuse (HTTP request smuggling).
    Malformed(String),
    /// A protocol variant the stage does not frame (memcached binary protocol): the connection
    /// is forwarded unframed, in chunks as read, still staged.
    Unsupported(&'static str),
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::TooLarge(what) => write!(f, "{what} too large"),
            FrameError::Malformed(why) => write!(f, "malformed request: {why}"),
            FrameError::Unsupported(what) => write!(f, "{what} is not framed"),
        }
    }
}

/// Frames the first request in `buf` for `protocol`.
pub fn request(
    protocol: Framing,
    buf: &[u8],
    limits: &Limits,
) -> Result<Option<RequestFrame>, FrameError> {
    match protocol {
        Framing::Http => http_request(buf, limits),
        Framing::Memcached => memcached_request(buf, limits),
    }
}

fn find(buf: &[u8], byte: u8) -> Option<usize> {
    buf.iter().position(|&b| b == byte)
}

fn trim_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

fn tokens(line: &[u8]) -> impl Iterator<Item = &[u8]> {
    line.split(|&b| b == b' ' || b == b'\t')
        .filter(|t| !t.is_empty())
}

fn parse_dec(token: &[u8]) -> Option<u64> {
    if token.is_empty() || token.len() > 19 || !token.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(token).ok()?.parse().ok()
}

/// A request with a data block of `data` bytes after a line of `line_len` bytes.
fn with_data(
    buf: &[u8],
    line_len: usize,
    data: u64,
    expects: bool,
    limits: &Limits,
) -> Result<Option<RequestFrame>, FrameError> {
    let total = (line_len as u64).saturating_add(data).saturating_add(2);
    if total > limits.max_request as u64 {
        return Err(FrameError::TooLarge("request data block"));
    }
    let total = total as usize;
    Ok((buf.len() >= total).then(|| RequestFrame::simple(total, expects)))
}

/// Frames one memcached text-protocol request: a command line, plus `<bytes>` + CRLF of data
/// for storage commands (`set add replace append prepend cas`) and meta set (`ms`).
///
/// `noreply` (storage, `delete incr decr touch flush_all verbosity`), `quit` and meta commands
/// with the `q` flag expect no response (for `q`, the usual case). A storage line whose
/// `<bytes>` is not a number is a single line: the server answers it with an error and does
/// not read a data block. The binary protocol (first byte 0x80) is [`FrameError::Unsupported`].
pub fn memcached_request(buf: &[u8], limits: &Limits) -> Result<Option<RequestFrame>, FrameError> {
    let Some(&first) = buf.first() else {
        return Ok(None);
    };
    if first == 0x80 {
        return Err(FrameError::Unsupported("memcached binary protocol"));
    }
    let Some(nl) = find(&buf[..buf.len().min(limits.max_line)], b'\n') else {
        return if buf.len() >= limits.max_line {
            Err(FrameError::TooLarge("command line"))
        } else {
            Ok(None)
        };
    };
    let line_len = nl + 1;
    let line = trim_cr(&buf[..nl]);
    let mut toks = tokens(line);
    let cmd = toks.next().unwrap_or(b"");
    // At most 8 argument tokens matter here; `get` may carry thousands of keys.
    let args: Vec<&[u8]> = toks.by_ref().take(8).collect();
    let more = toks.next().is_some();
    let last_is_noreply = !more && args.last().is_some_and(|t| *t == b"noreply");
    let has_q_flag = |from: usize| args.iter().skip(from).any(|t| *t == b"q") || more;
    match cmd {
        b"set" | b"add" | b"replace" | b"append" | b"prepend"
            if args.len() == 4 || args.len() == 5 =>
        {
            match parse_dec(args[3]) {
                Some(n) => with_data(buf, line_len, n, !last_is_noreply, limits),
                None => Ok(Some(RequestFrame::simple(line_len, true))),
            }
        }
        b"cas" if args.len() == 5 || args.len() == 6 => match parse_dec(args[3]) {
            Some(n) => with_data(buf, line_len, n, !last_is_noreply, limits),
            None => Ok(Some(RequestFrame::simple(line_len, true))),
        },
        b"ms" if args.len() >= 2 => match parse_dec(args[1]) {
            Some(n) => with_data(buf, line_len, n, !has_q_flag(2), limits),
            None => Ok(Some(RequestFrame::simple(line_len, true))),
        },
        b"mg" | b"md" | b"ma" | b"me" => Ok(Some(RequestFrame::simple(line_len, !has_q_flag(1)))),
        b"delete" | b"incr" | b"decr" | b"touch" | b"flush_all" | b"verbosity" => {
            Ok(Some(RequestFrame::simple(line_len, !last_is_noreply)))
        }
        b"quit" => Ok(Some(RequestFrame::simple(line_len, false))),
        _ => Ok(Some(RequestFrame::simple(line_len, true))),
    }
}

/// Frames one HTTP/1.x request with [`preheat_http::request_len`]: request line and headers,
/// then a body by `Content-Length` or `Transfer-Encoding: chunked` (RFC 9112 §6). Requests a
/// proxy must not guess about are [`FrameError::Malformed`]: both `Content-Length` and
/// `Transfer-Encoding`, differing `Content-Length` values, a transfer coding other than final
/// `chunked`, obsolete line folding, whitespace before a header colon. Empty lines before the
/// request line belong to it.
pub fn http_request(buf: &[u8], limits: &Limits) -> Result<Option<RequestFrame>, FrameError> {
    match preheat_http::request_len(buf, &limits.http()) {
        Ok(Some(f)) => Ok(Some(RequestFrame {
            len: f.len,
            expects_response: true,
            head: f.head.method == "HEAD",
            opaque_after: f.head.upgrade || f.head.method == "CONNECT",
        })),
        Ok(None) => Ok(None),
        Err(preheat_http::Error::TooLarge(what)) => Err(FrameError::TooLarge(what)),
        Err(preheat_http::Error::Malformed(why)) => Err(FrameError::Malformed(why)),
    }
}

/// Length of the first complete memcached response in `buf` (`VALUE` blocks up to `END`, `STAT`
/// lines up to `END`, a meta `VA` block, or any other single line). Used by clients that need
/// the response bytes (the benchmark); the proxy uses the streaming [`ResponseTracker`].
pub fn memcached_response_len(buf: &[u8]) -> Result<Option<usize>, String> {
    let mut tracker = ResponseTracker::new(Framing::Memcached, usize::MAX);
    let (used, event) = tracker.advance(buf, false);
    match event {
        Event::Complete => Ok(Some(used)),
        Event::Lost(why) => Err(why),
        _ => Ok(None),
    }
}

/// What [`ResponseTracker::advance`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// All input consumed; the current response (if any) is not complete yet.
    NeedMore,
    /// A final response completed (answers the oldest outstanding request).
    Complete,
    /// An HTTP 1xx interim response completed (not the final answer).
    Interim,
    /// `101 Switching Protocols`: the response completed and the stream is no longer framed.
    Opaque,
    /// The stream cannot be framed any more (the proxy keeps forwarding, untimed).
    Lost(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum After {
    /// memcached `VALUE` data: the response continues with more lines.
    McContinue,
    /// memcached meta `VA` data: the response is complete.
    Complete,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Line,
    Skip { left: u64, then: After },
    UntilEof,
    Opaque,
}

/// Streaming response framer: feed it the backend's bytes as they arrive; it reports each
/// completed response without buffering more than one memcached line or HTTP head.
#[derive(Debug, Clone)]
pub struct ResponseTracker {
    protocol: Framing,
    /// Longest memcached line or HTTP head.
    max_line: usize,
    state: State,
    /// A memcached line, or an HTTP head, read so far.
    line: Vec<u8>,
    /// The body of the current HTTP response, once its head is complete.
    body: Option<preheat_http::BodyReader>,
    /// Part of a response has been consumed but not its end.
    in_response: bool,
}

impl ResponseTracker {
    pub fn new(protocol: Framing, max_line: usize) -> ResponseTracker {
        ResponseTracker {
            protocol,
            max_line,
            state: State::Line,
            line: Vec::new(),
            body: None,
            in_response: false,
        }
    }

    /// Whether part of a response has been seen but not its end (a proxy-generated error
    /// cannot be inserted into the stream now).
    pub fn mid_response(&self) -> bool {
        self.in_response
    }

    /// Whether the stream is no longer framed.
    pub fn is_opaque(&self) -> bool {
        matches!(self.state, State::Opaque | State::UntilEof)
    }

    /// Consumes bytes from `data` up to the end of the first response that completes in it.
    /// `head` says whether the oldest outstanding request is an HTTP `HEAD` (its response has
    /// no body). Returns the bytes consumed and what happened; call again with the rest.
    pub fn advance(&mut self, data: &[u8], head: bool) -> (usize, Event) {
        if self.protocol == Framing::Http {
            return self.advance_http(data, head);
        }
        let mut i = 0;
        while i < data.len() {
            match self.state {
                State::Opaque | State::UntilEof => {
                    self.in_response = matches!(self.state, State::UntilEof);
                    return (data.len(), Event::NeedMore);
                }
                State::Skip { left, then } => {
                    let n = left.min((data.len() - i) as u64);
                    i += n as usize;
                    let left = left - n;
                    if left > 0 {
                        self.state = State::Skip { left, then };
                        continue;
                    }
                    self.state = State::Line;
                    match then {
                        After::McContinue => {}
                        After::Complete => {
                            self.in_response = false;
                            return (i, Event::Complete);
                        }
                    }
                }
                State::Line => {
                    self.in_response = true;
                    let rest = &data[i..];
                    let Some(nl) = find(rest, b'\n') else {
                        self.line.extend_from_slice(rest);
                        if self.line.len() > self.max_line {
                            return self.lose(data.len(), "response line too long");
                        }
                        return (data.len(), Event::NeedMore);
                    };
                    self.line.extend_from_slice(&rest[..nl]);
                    i += nl + 1;
                    if self.line.len() > self.max_line {
                        return self.lose(i, "response line too long");
                    }
                    let mut line = std::mem::take(&mut self.line);
                    if line.last() == Some(&b'\r') {
                        line.pop();
                    }
                    let event = self.memcached_line(&line);
                    line.clear();
                    self.line = line;
                    match event {
                        Event::NeedMore => {}
                        Event::Lost(_) => {
                            self.state = State::Opaque;
                            self.in_response = false;
                            return (i, event);
                        }
                        other => {
                            if !matches!(self.state, State::Opaque | State::UntilEof) {
                                self.in_response = false;
                            }
                            return (i, other);
                        }
                    }
                }
            }
        }
        (i, Event::NeedMore)
    }

    fn lose(&mut self, consumed: usize, why: &str) -> (usize, Event) {
        self.state = State::Opaque;
        self.in_response = false;
        (consumed, Event::Lost(why.to_string()))
    }

    /// The backend closed its side: completes a response delimited by the connection close
    /// (HTTP without length). Returns whether one completed.
    pub fn eof(&mut self) -> bool {
        if self.state == State::UntilEof {
            self.state = State::Opaque;
            self.in_response = false;
            true
        } else {
            false
        }
    }

    fn memcached_line(&mut self, line: &[u8]) -> Event {
        let mut toks = tokens(line);
        match toks.next().unwrap_or(b"") {
            b"VALUE" => {
                let bytes = toks.nth(2).and_then(parse_dec);
                match bytes {
                    Some(n) => {
                        self.state = State::Skip {
                            left: n + 2,
                            then: After::McContinue,
                        };
                        Event::NeedMore
                    }
                    None => Event::Lost("VALUE line without a byte count".into()),
                }
            }
            b"VA" => match toks.next().and_then(parse_dec) {
                Some(n) => {
                    self.state = State::Skip {
                        left: n + 2,
                        then: After::Complete,
                    };
                    Event::NeedMore
                }
                None => Event::Lost("VA line without a size".into()),
            },
            b"STAT" | b"ITEM" => Event::NeedMore,
            _ => Event::Complete,
        }
    }

    /// [`ResponseTracker::advance`] for HTTP: the head is buffered until complete and parsed by
    /// [`preheat_http::response_head`], the body framed by [`preheat_http::BodyReader`].
    fn advance_http(&mut self, data: &[u8], head: bool) -> (usize, Event) {
        let mut i = 0;
        loop {
            if matches!(self.state, State::Opaque | State::UntilEof) {
                self.in_response = self.state == State::UntilEof;
                return (data.len(), Event::NeedMore);
            }
            if let Some(body) = &mut self.body {
                match body.advance(&data[i..]) {
                    Ok(step) => {
                        i += step.consumed;
                        if step.done {
                            self.body = None;
                            self.in_response = false;
                            return (i, Event::Complete);
                        }
                        if i == data.len() {
                            return (i, Event::NeedMore);
                        }
                    }
                    Err(e) => return self.lose(data.len(), &e.to_string()),
                }
                continue;
            }
            if i == data.len() {
                return (i, Event::NeedMore);
            }
            self.in_response = true;
            let before = self.line.len();
            self.line.extend_from_slice(&data[i..]);
            let h = match preheat_http::response_head(&self.line, head, self.max_line) {
                Ok(Some(h)) => h,
                Ok(None) => return (data.len(), Event::NeedMore),
                Err(e) => {
                    self.line.clear();
                    return self.lose(data.len(), &e.to_string());
                }
            };
            i += h.len - before;
            self.line.clear();
            match (h.status, h.body) {
                (101, _) => {
                    self.state = State::Opaque;
                    self.in_response = false;
                    return (i, Event::Opaque);
                }
                (100..=199, _) => {
                    self.in_response = false;
                    return (i, Event::Interim);
                }
                (_, preheat_http::Body::None) => {
                    self.in_response = false;
                    return (i, Event::Complete);
                }
                (_, preheat_http::Body::UntilClose) => self.state = State::UntilEof,
                (_, body) => {
                    self.body = Some(preheat_http::BodyReader::new(body, self.max_line));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lim() -> Limits {
        Limits::default()
    }

    fn mc(buf: &[u8]) -> Result<Option<RequestFrame>, FrameError> {
        memcached_request(buf, &lim())
    }

    fn http(buf: &[u8]) -> Result<Option<RequestFrame>, FrameError> {
        http_request(buf, &lim())
    }

    /// Splits a pipelined buffer into request lengths.
    fn split(proto: Framing, mut buf: &[u8]) -> Vec<(usize, bool)> {
        let mut out = Vec::new();
        while let Some(f) = request(proto, buf, &lim()).unwrap() {
            out.push((f.len, f.expects_response));
            buf = &buf[f.len..];
        }
        assert!(buf.is_empty(), "leftover {buf:?}");
        out
    }

    #[test]
    fn memcached_lines_and_data_blocks() {
        assert_eq!(mc(b"").unwrap(), None);
        assert_eq!(mc(b"get key:1").unwrap(), None);
        assert_eq!(mc(b"get key:1\r\n").unwrap().unwrap().len, 11);
        assert_eq!(mc(b"get a\n").unwrap().unwrap().len, 6);
        // Data containing CRLF is counted, not searched.
        let set = b"set k 0 0 5\r\na\r\nb\r\r\n";
        assert_eq!(mc(&set[..set.len() - 1]).unwrap(), None);
        let f = mc(set).unwrap().unwrap();
        assert_eq!((f.len, f.expects_response), (set.len(), true));
        let f = mc(b"set k 0 0 1 noreply\r\nx\r\n").unwrap().unwrap();
        assert_eq!((f.len, f.expects_response), (24, false));
        let f = mc(b"cas k 0 0 1 99\r\nx\r\n").unwrap().unwrap();
        assert_eq!((f.len, f.expects_response), (19, true));
        // Unparseable length: a single line the server rejects.
        assert_eq!(mc(b"set k 0 0 x\r\nzz").unwrap().unwrap().len, 13);
        assert!(
            !mc(b"delete k noreply\r\n")
                .unwrap()
                .unwrap()
                .expects_response
        );
        assert!(mc(b"delete k\r\n").unwrap().unwrap().expects_response);
        assert!(!mc(b"quit\r\n").unwrap().unwrap().expects_response);
        let f = mc(b"ms k 2 q T0\r\nab\r\n").unwrap().unwrap();
        assert_eq!((f.len, f.expects_response), (17, false));
        assert!(mc(b"mg k v\r\n").unwrap().unwrap().expects_response);
        assert!(!mc(b"mg k v q\r\n").unwrap().unwrap().expects_response);
        assert_eq!(
            mc(&[0x80, 0, 0, 0]),
            Err(FrameError::Unsupported("memcached binary protocol"))
        );
    }

    #[test]
    fn memcached_limits() {
        let l = Limits {
            max_line: 16,
            max_header: 16,
            max_request: 64,
        };
        assert_eq!(memcached_request(b"get 0123456789", &l).unwrap(), None);
        assert!(memcached_request(b"get 0123456789abcdef", &l).is_err());
        assert!(matches!(
            memcached_request(b"set k 0 0 100\r\n", &l),
            Err(FrameError::TooLarge(_))
        ));
    }

    #[test]
    fn memcached_pipeline_split_at_every_byte() {
        let buf: &[u8] =
            b"get a b c\r\nset k 1 2 3\r\nv\r\n\r\nget k\r\ndelete k noreply\r\nversion\r\n";
        let whole = split(Framing::Memcached, buf);
        assert_eq!(
            whole,
            vec![(11, true), (18, true), (7, true), (18, false), (9, true)]
        );
        // Every prefix frames consistently with the whole.
        for cut in 0..buf.len() {
            let mut prefix = &buf[..cut];
            let mut got = Vec::new();
            while let Some(f) = mc(prefix).unwrap() {
                got.push((f.len, f.expects_response));
                prefix = &prefix[f.len..];
            }
            assert_eq!(got[..], whole[..got.len()], "cut {cut}");
        }
    }

    #[test]
    fn http_requests() {
        let get = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
        assert_eq!(http(&get[..get.len() - 1]).unwrap(), None);
        let f = http(get).unwrap().unwrap();
        assert_eq!((f.len, f.head, f.opaque_after), (get.len(), false, false));
        assert!(http(b"HEAD / HTTP/1.1\r\n\r\n").unwrap().unwrap().head);
        let post = b"POST /a HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello";
        assert_eq!(http(&post[..post.len() - 1]).unwrap(), None);
        assert_eq!(http(post).unwrap().unwrap().len, post.len());
        let chunked = b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5;x=y\r\nhello\r\n0\r\nT: 1\r\n\r\n";
        for cut in 0..chunked.len() {
            assert_eq!(http(&chunked[..cut]).unwrap(), None, "cut {cut}");
        }
        assert_eq!(http(chunked).unwrap().unwrap().len, chunked.len());
        assert_eq!(
            http(b"\r\nGET / HTTP/1.0\n\n").unwrap().unwrap().len,
            18,
            "leading empty line and bare LF"
        );
        assert!(
            http(b"GET /ws HTTP/1.1\r\nUpgrade: websocket\r\n\r\n")
                .unwrap()
                .unwrap()
                .opaque_after
        );
        let pipelined = b"GET /1 HTTP/1.1\r\n\r\nPOST /2 HTTP/1.1\r\nContent-Length: 2\r\n\r\nokGET /3 HTTP/1.1\r\n\r\n";
        assert_eq!(
            split(Framing::Http, pipelined),
            vec![(19, true), (41, true), (19, true)]
        );
    }

    /// The refusals themselves are `preheat_http`'s (tested there); here, that they reach the
    /// proxy as the right [`FrameError`].
    #[test]
    fn http_refusals_map_to_frame_errors() {
        assert!(matches!(
            http(b"GET / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n"),
            Err(FrameError::Malformed(_))
        ));
        let l = Limits {
            max_line: 64,
            max_header: 32,
            max_request: 100,
        };
        assert!(matches!(
            http_request(&[b'a'; 40], &l),
            Err(FrameError::TooLarge(_))
        ));
        assert!(matches!(
            http_request(b"POST / HTTP/1.1\r\nContent-Length: 200\r\n\r\n", &l),
            Err(FrameError::TooLarge(_))
        ));
    }

    /// Feeds `data` in pieces of `step` bytes; returns the events (not NeedMore).
    fn track(proto: Framing, data: &[u8], step: usize, heads: &[bool]) -> Vec<Event> {
        let mut t = ResponseTracker::new(proto, 1024);
        let mut events = Vec::new();
        for piece in data.chunks(step) {
            let mut off = 0;
            while off < piece.len() {
                let done = events.iter().filter(|e| **e == Event::Complete).count();
                let head = heads.get(done).copied().unwrap_or(false);
                let (n, e) = t.advance(&piece[off..], head);
                off += n;
                if e != Event::NeedMore {
                    events.push(e);
                }
            }
        }
        if t.eof() {
            events.push(Event::Complete);
        }
        events
    }

    #[test]
    fn memcached_responses() {
        let data: &[u8] = b"VALUE a 0 3\r\nx\r\n\r\nVALUE b 1 1 7\r\ny\r\nEND\r\nEND\r\nSTORED\r\nSTAT pid 1\r\nSTAT x y\r\nEND\r\nVA 2 f\r\nok\r\nHD\r\nSERVER_ERROR out of memory\r\n";
        for step in [1, 2, 3, 7, data.len()] {
            assert_eq!(
                track(Framing::Memcached, data, step, &[]),
                vec![Event::Complete; 7],
                "step {step}"
            );
        }
        assert_eq!(memcached_response_len(b"VALUE a 0 1\r\nx\r\nEN"), Ok(None));
        assert_eq!(memcached_response_len(b"END\r\nEND\r\n"), Ok(Some(5)));
        assert!(memcached_response_len(b"VALUE a 0 zz\r\n").is_err());
    }

    #[test]
    fn http_responses() {
        let data: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nHTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX: y\r\n\r\nHTTP/1.0 200 OK\r\n\r\nuntil close";
        // Second response answers a HEAD: no body despite Content-Length.
        let heads = [false, true];
        for step in [1, 5, data.len()] {
            assert_eq!(
                track(Framing::Http, data, step, &heads),
                vec![
                    Event::Interim,
                    Event::Complete,
                    Event::Complete,
                    Event::Complete,
                    Event::Complete,
                    Event::Complete
                ],
                "step {step}"
            );
        }
        assert_eq!(
            track(
                Framing::Http,
                b"HTTP/1.1 101 Switching Protocols\r\n\r\n\x81\x00",
                4,
                &[]
            ),
            vec![Event::Opaque]
        );
        assert!(matches!(
            track(Framing::Http, b"garbage\r\n", 100, &[])[0],
            Event::Lost(_)
        ));
    }

    #[test]
    fn mid_response_tracking() {
        let mut t = ResponseTracker::new(Framing::Memcached, 1024);
        assert!(!t.mid_response());
        assert_eq!(t.advance(b"VALUE a 0 3\r\nx", false).1, Event::NeedMore);
        assert!(t.mid_response());
        assert_eq!(t.advance(b"yz\r\nEND\r\n", false).1, Event::Complete);
        assert!(!t.mid_response());
    }
}
