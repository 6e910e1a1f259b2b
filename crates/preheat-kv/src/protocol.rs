//! Incremental parser for the subset of the memcached text protocol that
//! preheat-kv speaks.
//!
//! The parser is pure: hand it the not-yet-consumed bytes of a connection's
//! input buffer and it reports either that a complete request is present (and
//! how many bytes it spans), that more input is needed, or that the peer is
//! sending garbage and the connection must be closed. It does no I/O, never
//! allocates and never panics, whatever the input.
//!
//! The behaviour deliberately mirrors memcached 1.6 (`proto_text.c`) so that
//! clients see byte-identical replies:
//!
//! * A command line ends at `\n`; one `\r` before it is stripped, and a NUL
//!   byte truncates it (memcached treats it as a C string). Tokens are
//!   separated by one or more spaces (tabs are *not* separators).
//! * A line longer than [`MAX_LINE_LEN`] is only legal for `get`/`gets`
//!   (multi-gets); anything else that long closes the connection. (memcached
//!   applies its 2048-byte check only when no newline has arrived yet; we apply
//!   it always so the result does not depend on TCP segmentation.) Multi-get
//!   lines are capped at [`MAX_GET_LINE_LEN`].
//! * Wrong token counts reply `ERROR`; malformed numbers or keys longer than
//!   [`MAX_KEY_LEN`] reply `CLIENT_ERROR bad command line format`. Numbers are
//!   read the way memcached reads them on 64-bit Linux (C `strtoul`/`strtol`
//!   truncated to 32 bits), quirks included: flags `4294967297` are stored as
//!   1, exptime `2147483648` becomes negative (already expired).
//! * `noreply` suppresses every reply of that command, including errors
//!   detected after the token count was validated (this is what memcached's
//!   `out_string` does).
//! * A `set` whose length exceeds [`MAX_VALUE_LEN`] replies
//!   `SERVER_ERROR object too large for cache`, drops any existing value for
//!   the key and swallows the `<bytes>\r\n` data block.
//! * A data block not terminated by `\r\n` replies
//!   `CLIENT_ERROR bad data chunk`; exactly `<bytes> + 2` bytes are consumed
//!   and parsing continues after them.
//!
//! "Never panics" is checked by clippy for this module (no indexing or slicing that could go out
//! of bounds, no unwrap/expect/panic; tests excepted).

#![cfg_attr(
    not(test),
    deny(
        clippy::indexing_slicing,
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::unreachable,
        clippy::todo,
        clippy::unimplemented
    )
)]

/// Longest key accepted (memcached's `KEY_MAX_LENGTH`).
pub const MAX_KEY_LEN: usize = 250;
/// Largest value accepted by `set` (memcached's default `-I 1m`).
pub const MAX_VALUE_LEN: usize = 1024 * 1024;
/// Longest command line (excluding the `\n`) for anything but a multi-get.
pub const MAX_LINE_LEN: usize = 2048;
/// Longest multi-get line (excluding the `\n`).
pub const MAX_GET_LINE_LEN: usize = 64 * 1024;

/// Reply to unknown commands and wrong token counts.
pub const ERR_UNKNOWN: &str = "ERROR";
/// Reply to malformed arguments and over-long keys.
pub const ERR_BAD_FORMAT: &str = "CLIENT_ERROR bad command line format";
/// Reply to `delete` with unexpected extra arguments.
pub const ERR_DELETE_USAGE: &str =
    "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]";
/// Reply to `flush_all` with a non-numeric delay.
pub const ERR_BAD_EXPTIME: &str = "CLIENT_ERROR invalid exptime argument";

/// The keys of a `get` request, validated (at least one, none longer than
/// [`MAX_KEY_LEN`]). Iterate with [`Keys::iter`]; kept as a slice of the
/// request line so parsing does not allocate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keys<'a> {
    rest: &'a [u8],
}

impl<'a> Keys<'a> {
    /// The keys, in request order (duplicates preserved, as memcached does).
    pub fn iter(&self) -> Tokens<'a> {
        Tokens { rest: self.rest }
    }
}

/// Iterator over space-separated tokens of a command line.
#[derive(Debug, Clone)]
pub struct Tokens<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Tokens<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let start = self.rest.iter().position(|&b| b != b' ')?;
        let rest = self.rest.get(start..)?;
        let end = rest.iter().position(|&b| b == b' ').unwrap_or(rest.len());
        let (token, tail) = rest.split_at_checked(end)?;
        self.rest = tail;
        Some(token)
    }
}

/// One parsed request. Borrowed slices point into the caller's buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request<'a> {
    /// `get <key>*`
    Get(Keys<'a>),
    /// `set <key> <flags> <exptime> <bytes> [noreply]` plus its data block.
    Set {
        key: &'a [u8],
        flags: u32,
        exptime: i32,
        data: &'a [u8],
        noreply: bool,
    },
    /// A `set` whose value is larger than [`MAX_VALUE_LEN`]. Only the command
    /// line was consumed; the caller must discard the next `swallow` bytes
    /// (the data block and its `\r\n`) as they arrive.
    SetTooLarge {
        key: &'a [u8],
        swallow: usize,
        noreply: bool,
    },
    /// A `set` whose data block was not followed by `\r\n`. Nothing is stored.
    BadDataChunk { noreply: bool },
    /// `delete <key> [0] [noreply]`
    Delete { key: &'a [u8], noreply: bool },
    /// `flush_all [delay] [noreply]`; `delay <= 0` means now.
    FlushAll { delay: i32, noreply: bool },
    /// `stats` (general statistics).
    Stats,
    /// `stats reset`
    StatsReset,
    /// `version`
    Version,
    /// `quit`
    Quit,
    /// A request answered with a fixed error line (without `\r\n`), unless
    /// `noreply` was given.
    Error { reply: &'static str, noreply: bool },
}

/// Result of [`parse`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parse<'a> {
    /// The buffer holds no complete request yet; read more and retry with the
    /// same (extended) buffer.
    Incomplete,
    /// A complete request spanning the first `consumed` bytes of the buffer.
    Complete {
        request: Request<'a>,
        consumed: usize,
    },
    /// The peer violated a hard limit; the connection should be closed. The
    /// string says why (for logs).
    Invalid(&'static str),
}

/// Parses the request at the start of `buf`.
pub fn parse(buf: &[u8]) -> Parse<'_> {
    let window = buf.get(..MAX_GET_LINE_LEN + 1).unwrap_or(buf);
    // The line before the first `\n` (`split` always yields a first piece; it is the whole
    // window when there is no `\n`).
    let mut pieces = window.split(|&b| b == b'\n');
    let line = pieces.next().unwrap_or(window);
    let has_newline = pieces.next().is_some();
    let Some(nl) = has_newline.then_some(line.len()) else {
        if buf.len() > MAX_LINE_LEN && !is_multiget(buf) {
            return Parse::Invalid("command line too long");
        }
        if buf.len() > MAX_GET_LINE_LEN {
            return Parse::Invalid("get line too long");
        }
        return Parse::Incomplete;
    };
    if nl > MAX_LINE_LEN && !is_multiget(buf) {
        return Parse::Invalid("command line too long");
    }
    let line_end = nl + 1;
    let mut line = line;
    if let Some(stripped) = line.strip_suffix(b"\r") {
        line = stripped;
    }
    // memcached tokenizes the line as a C string: a NUL byte ends it.
    line = line.split(|&b| b == 0).next().unwrap_or(line);

    let mut tokens = Tokens { rest: line };
    let request = match tokens.next() {
        Some(b"get") => parse_get(tokens),
        Some(b"set") => return parse_set(buf, tokens, line_end),
        Some(b"delete") => parse_delete(tokens),
        Some(b"flush_all") => parse_flush_all(tokens),
        Some(b"stats") => match tokens.next() {
            None => Request::Stats,
            Some(b"reset") => Request::StatsReset,
            Some(_) => error(ERR_UNKNOWN, false),
        },
        Some(b"version") => Request::Version,
        Some(b"quit") => Request::Quit,
        _ => error(ERR_UNKNOWN, false),
    };
    Parse::Complete {
        request,
        consumed: line_end,
    }
}

/// memcached tolerates long lines only for multi-gets: at most 100 leading
/// spaces, then `get ` or `gets `.
fn is_multiget(buf: &[u8]) -> bool {
    let spaces = buf.iter().take_while(|&&b| b == b' ').count();
    let rest = buf.get(spaces..).unwrap_or_default();
    spaces <= 100 && (rest.starts_with(b"get ") || rest.starts_with(b"gets "))
}

fn error(reply: &'static str, noreply: bool) -> Request<'static> {
    Request::Error { reply, noreply }
}

/// Collects up to `N` tokens into an array; returns how many there were in
/// total (counting stops at `N + 1`, enough to reject "too many").
fn collect<'a, const N: usize>(tokens: Tokens<'a>) -> ([&'a [u8]; N], usize) {
    let mut out: [&[u8]; N] = [&[]; N];
    let mut n = 0;
    for token in tokens.take(N + 1) {
        if let Some(slot) = out.get_mut(n) {
            *slot = token;
        }
        n += 1;
    }
    (out, n)
}

fn parse_get(tokens: Tokens<'_>) -> Request<'_> {
    let keys = Keys { rest: tokens.rest };
    let mut iter = keys.iter().peekable();
    if iter.peek().is_none() {
        return error(ERR_UNKNOWN, false);
    }
    if iter.any(|k| k.len() > MAX_KEY_LEN) {
        return error(ERR_BAD_FORMAT, false);
    }
    Request::Get(keys)
}

fn parse_set<'a>(buf: &'a [u8], tokens: Tokens<'a>, line_end: usize) -> Parse<'a> {
    let complete = |request, consumed| Parse::Complete { request, consumed };
    let (args, n) = collect::<5>(tokens);
    if n != 4 && n != 5 {
        return complete(error(ERR_UNKNOWN, false), line_end);
    }
    let noreply = n == 5 && args[4] == b"noreply";
    let key = args[0];
    if key.len() > MAX_KEY_LEN {
        return complete(error(ERR_BAD_FORMAT, noreply), line_end);
    }
    let (Some(flags), Some(exptime), Some(len)) =
        (parse_u32(args[1]), parse_i32(args[2]), parse_i32(args[3]))
    else {
        return complete(error(ERR_BAD_FORMAT, noreply), line_end);
    };
    // memcached rejects negative lengths and ones that overflow with the \r\n.
    let Ok(len) = usize::try_from(len) else {
        return complete(error(ERR_BAD_FORMAT, noreply), line_end);
    };
    if len > (i32::MAX - 2) as usize {
        return complete(error(ERR_BAD_FORMAT, noreply), line_end);
    }
    if len > MAX_VALUE_LEN {
        let request = Request::SetTooLarge {
            key,
            swallow: len + 2,
            noreply,
        };
        return complete(request, line_end);
    }
    let data_end = line_end + len;
    let end = data_end + 2;
    if buf.len() < end {
        return Parse::Incomplete;
    }
    if buf.get(data_end..end) != Some(b"\r\n") {
        return complete(Request::BadDataChunk { noreply }, end);
    }
    // `buf` holds at least `end` bytes (checked above), so this is always `Some`.
    let Some(data) = buf.get(line_end..data_end) else {
        return Parse::Incomplete;
    };
    let request = Request::Set {
        key,
        flags,
        exptime,
        data,
        noreply,
    };
    complete(request, end)
}

fn parse_delete(tokens: Tokens<'_>) -> Request<'_> {
    let (args, n) = collect::<3>(tokens);
    if !(1..=3).contains(&n) {
        return error(ERR_UNKNOWN, false);
    }
    let mut noreply = false;
    if n > 1 {
        // `delete <key> 0` is a legacy form with a zero "hold" time.
        let hold_is_zero = args[1] == b"0";
        let last = if n == 3 { args[2] } else { args[1] };
        noreply = last == b"noreply";
        let valid = (n == 2 && (hold_is_zero || noreply)) || (n == 3 && hold_is_zero && noreply);
        if !valid {
            return error(ERR_DELETE_USAGE, noreply);
        }
    }
    let key = args[0];
    if key.len() > MAX_KEY_LEN {
        return error(ERR_BAD_FORMAT, noreply);
    }
    Request::Delete { key, noreply }
}

fn parse_flush_all(tokens: Tokens<'_>) -> Request<'_> {
    let (args, n) = collect::<2>(tokens);
    if n > 2 {
        return error(ERR_UNKNOWN, false);
    }
    let last: &[u8] = match n {
        1 => args[0],
        2 => args[1],
        _ => b"",
    };
    let noreply = last == b"noreply";
    let mut delay = 0;
    if n != usize::from(noreply) {
        match parse_i32(args[0]) {
            Some(d) => delay = d,
            None => return error(ERR_BAD_EXPTIME, noreply),
        }
    }
    Request::FlushAll { delay, noreply }
}

/// memcached parses numbers with glibc's `strtoul`/`strtol` on a 64-bit
/// `long` and then stores them in 32 bits. This reproduces what those see:
/// optional leading whitespace, an optional sign, at least one decimal digit,
/// then the end of the token or a whitespace (or NUL) byte. Returns the sign
/// and the magnitude, the latter `None` if it overflows 64 bits (`ERANGE`).
fn c_number(token: &[u8]) -> Option<(bool, Option<u64>)> {
    let is_space = |b: u8| matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r');
    let start = token.iter().position(|&b| !is_space(b))?;
    let mut rest = token.get(start..)?;
    let negative = rest.first() == Some(&b'-');
    if let Some((b'+' | b'-', tail)) = rest.split_first() {
        rest = tail;
    }
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    let terminated = match rest.get(digits) {
        None => true,
        Some(&b) => b == 0 || is_space(b),
    };
    if digits == 0 || !terminated {
        return None;
    }
    let magnitude = rest.get(..digits)?.iter().try_fold(0u64, |acc, &b| {
        acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
    });
    Some((negative, magnitude))
}

/// memcached's `safe_strtoul` for 32-bit fields: `strtoul`, rejecting only
/// negative-looking wrap-arounds, then truncated to 32 bits (so `4294967297`
/// is 1 and `-0` is 0, exactly as memcached stores them).
fn parse_u32(token: &[u8]) -> Option<u32> {
    let (negative, magnitude) = c_number(token)?;
    let value = magnitude?;
    let value = if negative {
        value.wrapping_neg()
    } else {
        value
    };
    if (value as i64) < 0 && token.contains(&b'-') {
        return None;
    }
    Some(value as u32)
}

/// memcached's `safe_strtol`: `strtol` into a 64-bit `long` (rejecting
/// overflow), then truncated to 32 bits.
fn parse_i32(token: &[u8]) -> Option<i32> {
    let (negative, magnitude) = c_number(token)?;
    let magnitude = magnitude?;
    let value = if negative {
        0i64.checked_sub_unsigned(magnitude)?
    } else {
        i64::try_from(magnitude).ok()?
    };
    Some(value as i32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn complete(buf: &[u8]) -> (Request<'_>, usize) {
        match parse(buf) {
            Parse::Complete { request, consumed } => (request, consumed),
            other => panic!("expected a complete request for {buf:?}, got {other:?}"),
        }
    }

    fn keys(request: &Request<'_>) -> Vec<Vec<u8>> {
        match request {
            Request::Get(keys) => keys.iter().map(<[u8]>::to_vec).collect(),
            other => panic!("expected get, got {other:?}"),
        }
    }

    fn err(reply: &'static str) -> Request<'static> {
        Request::Error {
            reply,
            noreply: false,
        }
    }

    /// Parses every request in `buf`, returning them and the unconsumed tail.
    fn parse_all(buf: &[u8]) -> (Vec<Request<'_>>, &[u8]) {
        let mut requests = Vec::new();
        let mut pos = 0;
        for _ in 0..buf.len() + 1 {
            match parse(&buf[pos..]) {
                Parse::Complete { request, consumed } => {
                    assert!(consumed > 0 && pos + consumed <= buf.len());
                    requests.push(request);
                    pos += consumed;
                }
                Parse::Incomplete => break,
                Parse::Invalid(why) => panic!("invalid: {why}"),
            }
        }
        (requests, &buf[pos..])
    }

    #[test]
    fn get_single_and_multi() {
        let (req, used) = complete(b"get foo\r\n");
        assert_eq!(used, 9);
        assert_eq!(keys(&req), vec![b"foo".to_vec()]);

        let (req, used) = complete(b"get  a bb   ccc \r\nrest");
        assert_eq!(used, 18);
        assert_eq!(
            keys(&req),
            vec![b"a".to_vec(), b"bb".to_vec(), b"ccc".to_vec()]
        );

        // Bare \n is accepted, like memcached.
        let (req, used) = complete(b"get k\n");
        assert_eq!(used, 6);
        assert_eq!(keys(&req), vec![b"k".to_vec()]);
    }

    #[test]
    fn get_without_key_or_with_long_key() {
        assert_eq!(complete(b"get\r\n").0, err(ERR_UNKNOWN));
        assert_eq!(complete(b"get    \r\n").0, err(ERR_UNKNOWN));
        let mut line = b"get ok ".to_vec();
        line.resize(line.len() + MAX_KEY_LEN + 1, b'k');
        line.extend_from_slice(b"\r\n");
        assert_eq!(complete(&line).0, err(ERR_BAD_FORMAT));

        let mut line = b"get ".to_vec();
        line.resize(line.len() + MAX_KEY_LEN, b'k');
        line.extend_from_slice(b"\r\n");
        assert_eq!(keys(&complete(&line).0)[0].len(), MAX_KEY_LEN);
    }

    #[test]
    fn set_with_data() {
        let buf = b"set k 42 0 5\r\nhello\r\nget k\r\n";
        let (req, used) = complete(buf);
        assert_eq!(
            req,
            Request::Set {
                key: b"k",
                flags: 42,
                exptime: 0,
                data: b"hello",
                noreply: false
            }
        );
        assert_eq!(used, 21);
        assert_eq!(keys(&complete(&buf[used..]).0), vec![b"k".to_vec()]);
    }

    #[test]
    fn set_noreply_and_binary_data() {
        let (req, _) = complete(b"set k 0 -1 4 noreply\r\na\r\nb\r\n");
        assert_eq!(
            req,
            Request::Set {
                key: b"k",
                flags: 0,
                exptime: -1,
                data: b"a\r\nb",
                noreply: true
            }
        );
        // An unknown sixth token is ignored, as in memcached.
        let (req, _) = complete(b"set k 1 2 0 whatever\r\n\r\n");
        assert!(matches!(
            req,
            Request::Set {
                noreply: false,
                data: b"",
                ..
            }
        ));
    }

    #[test]
    fn set_data_spanning_reads() {
        let full = b"set key 7 0 10\r\n0123456789\r\n";
        for cut in 0..full.len() {
            assert_eq!(parse(&full[..cut]), Parse::Incomplete, "cut at {cut}");
        }
        let (req, used) = complete(full);
        assert_eq!(used, full.len());
        assert!(matches!(
            req,
            Request::Set {
                data: b"0123456789",
                flags: 7,
                ..
            }
        ));
    }

    #[test]
    fn partial_lines_need_more() {
        assert_eq!(parse(b""), Parse::Incomplete);
        assert_eq!(parse(b"ge"), Parse::Incomplete);
        assert_eq!(parse(b"get foo"), Parse::Incomplete);
        assert_eq!(parse(b"get foo\r"), Parse::Incomplete);
        assert_eq!(parse(b"set k 0 0 3\r"), Parse::Incomplete);
        assert_eq!(parse(b"set k 0 0 3\r\nab"), Parse::Incomplete);
        assert_eq!(parse(b"set k 0 0 3\r\nabc\r"), Parse::Incomplete);
    }

    #[test]
    fn pipelined_requests() {
        let buf = b"set a 1 0 1\r\nA\r\nget a b\r\ndelete a\r\nversion\r\nstats\r\n\
                    flush_all\r\nbogus\r\nquit\r\nget par";
        let (requests, tail) = parse_all(buf);
        assert_eq!(tail, b"get par");
        assert_eq!(requests.len(), 8);
        assert!(matches!(
            requests[0],
            Request::Set {
                key: b"a",
                data: b"A",
                ..
            }
        ));
        assert_eq!(keys(&requests[1]), vec![b"a".to_vec(), b"b".to_vec()]);
        assert_eq!(
            requests[2],
            Request::Delete {
                key: b"a",
                noreply: false
            }
        );
        assert_eq!(requests[3], Request::Version);
        assert_eq!(requests[4], Request::Stats);
        assert_eq!(
            requests[5],
            Request::FlushAll {
                delay: 0,
                noreply: false
            }
        );
        assert_eq!(requests[6], err(ERR_UNKNOWN));
        assert_eq!(requests[7], Request::Quit);
    }

    #[test]
    fn byte_at_a_time_matches_whole_buffer() {
        let stream = b"set x 3 0 2\r\nhi\r\nget x\r\ndelete x noreply\r\nget x y\r\n";
        let (whole, _) = parse_all(stream);
        // Feed one byte at a time, as a slow network would.
        let mut got = Vec::new();
        let mut start = 0;
        for end in 0..=stream.len() {
            if let Parse::Complete { request, consumed } = parse(&stream[start..end]) {
                got.push(request);
                start += consumed;
            }
        }
        assert_eq!(start, stream.len());
        assert_eq!(got, whole);
    }

    #[test]
    fn bad_data_chunk() {
        let buf = b"set k 0 0 3\r\nabcd\r\nget k\r\n";
        let (req, used) = complete(buf);
        assert_eq!(req, Request::BadDataChunk { noreply: false });
        // Exactly <bytes> + 2 bytes are consumed ("abc" + "d\r"), like memcached;
        // what follows ("\nget k\r\n") is parsed as commands.
        assert_eq!(used, 13 + 5);
        let (next, _) = complete(&buf[used..]);
        assert_eq!(next, err(ERR_UNKNOWN));

        let (req, _) = complete(b"set k 0 0 1 noreply\r\nxyz");
        assert_eq!(req, Request::BadDataChunk { noreply: true });
    }

    #[test]
    fn set_bad_arguments() {
        let bad = [
            &b"set k x 0 1\r\n"[..],
            b"set k 0 x 1\r\n",
            b"set k 0 0 x\r\n",
            b"set k -1 0 1\r\n",
            b"set k 18446744073709551616 0 1\r\n",
            b"set k 0 9223372036854775808 1\r\n",
            b"set k 0 0 -1\r\n",
            b"set k 0 0 2147483647\r\n",
            b"set k 0 0 1x\r\n",
            b"set k 0 0 +\r\n",
        ];
        for line in bad {
            assert_eq!(
                complete(line),
                (err(ERR_BAD_FORMAT), line.len()),
                "{line:?}"
            );
        }
        // The noreply flag still applies to the error.
        let (req, _) = complete(b"set k x 0 1 noreply\r\n");
        assert_eq!(
            req,
            Request::Error {
                reply: ERR_BAD_FORMAT,
                noreply: true
            }
        );
        // Wrong token counts are plain ERRORs.
        for line in [
            &b"set\r\n"[..],
            b"set k 0 0\r\n",
            b"set k 0 0 1 noreply x\r\n",
        ] {
            assert_eq!(complete(line).0, err(ERR_UNKNOWN), "{line:?}");
        }
        // memcached's 64-bit parse + 32-bit truncation.
        let (req, _) = complete(b"set k 4294967297 2147483648 4294967297\r\nx\r\n");
        assert!(matches!(
            req,
            Request::Set {
                flags: 1,
                exptime: i32::MIN,
                data: b"x",
                ..
            }
        ));
        // Limits of the numeric fields.
        let (req, _) = complete(b"set k 4294967295 -2147483648 0\r\n\r\n");
        assert!(matches!(
            req,
            Request::Set {
                flags: u32::MAX,
                exptime: i32::MIN,
                ..
            }
        ));
    }

    #[test]
    fn key_length_limit_on_set_and_delete() {
        let long = "k".repeat(MAX_KEY_LEN + 1);
        let line = format!("set {long} 0 0 1\r\nx\r\n");
        let (req, used) = complete(line.as_bytes());
        assert_eq!(req, err(ERR_BAD_FORMAT));
        // Only the line is consumed; memcached then parses the data as a command.
        assert_eq!(used, line.len() - 3);
        let line = format!("delete {long}\r\n");
        assert_eq!(complete(line.as_bytes()).0, err(ERR_BAD_FORMAT));
        let ok = "k".repeat(MAX_KEY_LEN);
        let line = format!("set {ok} 0 0 1\r\nx\r\n");
        assert!(matches!(complete(line.as_bytes()).0, Request::Set { .. }));
    }

    #[test]
    fn value_size_limit() {
        let line = format!("set big 0 0 {}\r\n", MAX_VALUE_LEN);
        let mut buf = line.clone().into_bytes();
        assert_eq!(parse(&buf), Parse::Incomplete);
        buf.resize(line.len() + MAX_VALUE_LEN, b'v');
        buf.extend_from_slice(b"\r\n");
        let (req, used) = complete(&buf);
        assert_eq!(used, buf.len());
        assert!(matches!(req, Request::Set { data, .. } if data.len() == MAX_VALUE_LEN));

        let line = format!("set big 0 0 {} noreply\r\n", MAX_VALUE_LEN + 1);
        let (req, used) = complete(line.as_bytes());
        assert_eq!(used, line.len());
        assert_eq!(
            req,
            Request::SetTooLarge {
                key: b"big",
                swallow: MAX_VALUE_LEN + 3,
                noreply: true
            }
        );
    }

    #[test]
    fn overlong_lines_close_the_connection() {
        let junk = vec![b'x'; MAX_LINE_LEN + 1];
        assert!(matches!(parse(&junk), Parse::Invalid(_)));
        assert_eq!(parse(&junk[..MAX_LINE_LEN]), Parse::Incomplete);
        // Even with a newline, a non-get line that long is rejected.
        let mut line = b"set ".to_vec();
        line.resize(MAX_LINE_LEN + 10, b' ');
        line.extend_from_slice(b"\r\n");
        assert!(matches!(parse(&line), Parse::Invalid(_)));

        // Multi-gets may be longer, up to MAX_GET_LINE_LEN.
        let mut get = b"get".to_vec();
        while get.len() < MAX_LINE_LEN * 3 {
            get.extend_from_slice(b" some_key");
        }
        assert_eq!(parse(&get), Parse::Incomplete);
        get.extend_from_slice(b"\r\n");
        assert!(keys(&complete(&get).0).len() > 100);

        let mut huge = b"get ".to_vec();
        huge.resize(MAX_GET_LINE_LEN + 1, b'a');
        assert!(matches!(parse(&huge), Parse::Invalid(_)));
        huge.extend_from_slice(b"\r\n");
        assert!(matches!(parse(&huge), Parse::Invalid(_)));

        // Too many leading spaces are not a multi-get.
        let mut spaced = vec![b' '; 101];
        spaced.extend_from_slice(b"get ");
        spaced.resize(MAX_LINE_LEN + 1, b'a');
        assert!(matches!(parse(&spaced), Parse::Invalid(_)));
    }

    #[test]
    fn delete_variants() {
        let d = |key: &'static [u8], noreply| Request::Delete { key, noreply };
        assert_eq!(complete(b"delete k\r\n").0, d(b"k", false));
        assert_eq!(complete(b"delete k 0\r\n").0, d(b"k", false));
        assert_eq!(complete(b"delete k noreply\r\n").0, d(b"k", true));
        assert_eq!(complete(b"delete k 0 noreply\r\n").0, d(b"k", true));
        assert_eq!(complete(b"delete k 5\r\n").0, err(ERR_DELETE_USAGE));
        assert_eq!(complete(b"delete\r\n").0, err(ERR_UNKNOWN));
        assert_eq!(complete(b"delete a b c d\r\n").0, err(ERR_UNKNOWN));
    }

    #[test]
    fn flush_all_variants() {
        let f = |delay, noreply| Request::FlushAll { delay, noreply };
        assert_eq!(complete(b"flush_all\r\n").0, f(0, false));
        assert_eq!(complete(b"flush_all 10\r\n").0, f(10, false));
        assert_eq!(complete(b"flush_all noreply\r\n").0, f(0, true));
        assert_eq!(complete(b"flush_all -3 noreply\r\n").0, f(-3, true));
        assert_eq!(complete(b"flush_all soon\r\n").0, err(ERR_BAD_EXPTIME));
        assert_eq!(complete(b"flush_all 1 2 3\r\n").0, err(ERR_UNKNOWN));
    }

    #[test]
    fn misc_commands() {
        assert_eq!(complete(b"version\r\n").0, Request::Version);
        assert_eq!(complete(b"quit\r\n").0, Request::Quit);
        assert_eq!(complete(b"stats\r\n").0, Request::Stats);
        assert_eq!(complete(b"stats reset\r\n").0, Request::StatsReset);
        assert_eq!(complete(b"stats slabs\r\n").0, err(ERR_UNKNOWN));
        assert_eq!(complete(b"\r\n").0, err(ERR_UNKNOWN));
        assert_eq!(complete(b"GET k\r\n").0, err(ERR_UNKNOWN));
        assert_eq!(complete(b"get\tk\r\n").0, err(ERR_UNKNOWN));
        assert_eq!(complete(b"gets k\r\n").0, err(ERR_UNKNOWN));
        // A NUL ends the command line, but the whole line is consumed.
        assert_eq!(complete(b"set a 5\0 0 1\r\n"), (err(ERR_UNKNOWN), 14));
        assert_eq!(complete(b"version\0junk\r\n"), (Request::Version, 14));
    }

    #[test]
    fn never_panics_on_arbitrary_input() {
        // Deterministic pseudo-random byte soup, biased towards protocol bytes.
        let alphabet = b"getsdl \r\n0123456789-+noreply\x00\xff";
        let mut rng = StdRng::seed_from_u64(0x2545_f491_4f6c_dd1d);
        let mut buf = Vec::with_capacity(4096);
        for round in 0..2000 {
            buf.clear();
            for _ in 0..(round % 300) {
                buf.push(alphabet[rng.gen_range(0..alphabet.len())]);
            }
            let mut pos = 0;
            for _ in 0..buf.len() + 1 {
                match parse(&buf[pos..]) {
                    Parse::Complete { consumed, .. } => {
                        assert!(consumed > 0 && pos + consumed <= buf.len());
                        pos += consumed;
                    }
                    Parse::Incomplete | Parse::Invalid(_) => break,
                }
            }
        }
    }

    #[test]
    fn number_parsing_matches_memcached() {
        assert_eq!(parse_u32(b"0"), Some(0));
        assert_eq!(parse_u32(b"+7"), Some(7));
        assert_eq!(parse_u32(b"-0"), Some(0));
        assert_eq!(parse_u32(b"\t7"), Some(7));
        assert_eq!(parse_u32(b"7\tjunk"), Some(7));
        assert_eq!(parse_u32(b"7\0junk"), Some(7));
        assert_eq!(parse_u32(b"4294967295"), Some(u32::MAX));
        assert_eq!(parse_u32(b"4294967296"), Some(0));
        assert_eq!(parse_u32(b"18446744073709551615"), Some(u32::MAX));
        assert_eq!(parse_u32(b"18446744073709551616"), None);
        assert_eq!(parse_u32(b"-18446744073709551615"), Some(1));
        assert_eq!(parse_u32(b"-1"), None);
        assert_eq!(parse_u32(b""), None);
        assert_eq!(parse_u32(b"x1"), None);
        assert_eq!(parse_u32(b"1x"), None);
        assert_eq!(parse_i32(b"-2147483648"), Some(i32::MIN));
        assert_eq!(parse_i32(b"2147483647"), Some(i32::MAX));
        assert_eq!(parse_i32(b"2147483648"), Some(i32::MIN));
        assert_eq!(parse_i32(b"-9223372036854775808"), Some(0));
        assert_eq!(parse_i32(b"9223372036854775808"), None);
        assert_eq!(parse_i32(b"-"), None);
        assert_eq!(parse_i32(b"99999999999999999999999"), None);
    }
}
