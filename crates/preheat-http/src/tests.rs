use super::*;
use proptest::prelude::*;

fn lim() -> Limits {
    Limits::default()
}

fn req(buf: &[u8]) -> Result<Option<Framed<RequestHead>>, Error> {
    request_len(buf, &lim())
}

fn resp(buf: &[u8], head: bool) -> Result<Option<FramedResponse>, Error> {
    response_len(buf, head, &lim())
}

#[test]
fn requests_by_length_and_chunks() {
    let get = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    assert_eq!(req(&get[..get.len() - 1]).unwrap(), None);
    let f = req(get).unwrap().unwrap();
    assert_eq!(
        (f.len, f.head.method.as_str(), f.head.body),
        (get.len(), "GET", Body::None)
    );
    let post = b"POST /a HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello";
    assert_eq!(req(&post[..post.len() - 1]).unwrap(), None);
    let f = req(post).unwrap().unwrap();
    assert_eq!((f.len, f.head.body), (post.len(), Body::Length(5)));
    let chunked = b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5;x=y\r\nhello\r\n0\r\nT: 1\r\n\r\n";
    for cut in 0..chunked.len() {
        assert_eq!(req(&chunked[..cut]).unwrap(), None, "cut {cut}");
    }
    assert_eq!(req(chunked).unwrap().unwrap().len, chunked.len());
    // Leading empty lines belong to the request; bare LF line ends.
    assert_eq!(req(b"\r\nGET / HTTP/1.0\n\n").unwrap().unwrap().len, 18);
    assert!(
        req(b"GET /ws HTTP/1.1\r\nUpgrade: websocket\r\n\r\n")
            .unwrap()
            .unwrap()
            .head
            .upgrade
    );
    assert_eq!(
        req(b"GET / HTTP/1.1\r\nContent-Length: 3, 3\r\n\r\nabc")
            .unwrap()
            .unwrap()
            .len,
        43
    );
}

#[test]
fn requests_with_ambiguous_framing_are_refused() {
    for bad in [
        &b"GET / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
        b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        b"GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
        b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
        b"GET / HTTP/1.1\r\nX: a\r\n b\r\n\r\n",
        b"GET / HTTP/1.1\r\nX : a\r\n\r\n",
        b"GET /\r\n\r\n",
        b"GET / SPDY/3\r\n\r\n",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nabc",
    ] {
        assert!(
            matches!(req(bad), Err(Error::Malformed(_))),
            "{:?}",
            String::from_utf8_lossy(bad)
        );
    }
}

#[test]
fn limits() {
    let l = Limits {
        max_line: 8,
        max_head: 32,
        max_message: 100,
    };
    assert_eq!(
        request_len(&[b'a'; 40], &l),
        Err(Error::TooLarge("request head"))
    );
    assert_eq!(
        request_len(
            b"POST / HTTP/1.1\r\nContent-Length: 200\r\n\r\n",
            &Limits { max_head: 64, ..l }
        ),
        Err(Error::TooLarge("message"))
    );
    let long_chunk_line = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1;aaaaaaaaaa";
    assert_eq!(
        request_len(long_chunk_line, &Limits { max_head: 64, ..l }),
        Err(Error::TooLarge("chunk line"))
    );
    // Many header fields: more than the first try's room, still parsed.
    let mut many = b"GET / HTTP/1.1\r\n".to_vec();
    for i in 0..300 {
        many.extend_from_slice(format!("X-{i}: {i}\r\n").as_bytes());
    }
    many.extend_from_slice(b"\r\n");
    assert_eq!(req(&many).unwrap().unwrap().len, many.len());
}

#[test]
fn responses_by_length_chunks_and_close() {
    let f = resp(
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloHTTP/1.1",
        false,
    )
    .unwrap()
    .unwrap();
    assert_eq!((f.len, f.head.status, f.head.close), (43, 200, false));
    assert_eq!(f.payload, b"hello");
    // A HEAD response has no body whatever its fields say; 204/304/1xx neither.
    let f = resp(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", true)
        .unwrap()
        .unwrap();
    assert_eq!((f.len, f.head.body, f.payload.len()), (38, Body::None, 0));
    for status in ["100 Continue", "204 No Content", "304 Not Modified"] {
        let r = format!("HTTP/1.1 {status}\r\nContent-Length: 9\r\n\r\n");
        assert_eq!(resp(r.as_bytes(), false).unwrap().unwrap().len, r.len());
    }
    // Chunked: decoded; Transfer-Encoding overrides Content-Length.
    let chunked = b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;ext\r\nde\r\n0\r\nX: y\r\n\r\n";
    let f = resp(chunked, false).unwrap().unwrap();
    assert_eq!((f.len, f.head.body), (chunked.len(), Body::Chunked));
    assert_eq!(f.payload, b"abcde");
    // No length: until the close (never complete from a buffer), and the server closes.
    let h = response_head(b"HTTP/1.0 200 OK\r\n\r\nrest", false, 1024)
        .unwrap()
        .unwrap();
    assert_eq!((h.body, h.close, h.len), (Body::UntilClose, true, 19));
    assert_eq!(resp(b"HTTP/1.0 200 OK\r\n\r\nrest", false).unwrap(), None);
    // Connection: close, HTTP/1.0 keep-alive.
    let h = |r: &[u8]| response_head(r, false, 1024).unwrap().unwrap().close;
    assert!(h(
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    ));
    assert!(!h(
        b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 0\r\n\r\n"
    ));
    assert!(h(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n"));
    // Bad framing.
    for bad in [
        &b"garbage\r\n\r\n"[..],
        b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1, 2\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX",
    ] {
        assert!(
            matches!(resp(bad, false), Err(Error::Malformed(_))),
            "{:?}",
            String::from_utf8_lossy(bad)
        );
    }
}

#[test]
fn until_close_body_completes_at_eof() {
    let mut r = BodyReader::new(Body::UntilClose, 64);
    let step = r.advance(b"abc").unwrap();
    assert_eq!((step.consumed, step.payload, step.done), (3, 0..3, false));
    assert!(r.eof());
}

/// Feeds `data` to a [`BodyReader`] in pieces at `cuts`; returns (bytes consumed, payload).
fn feed(body: Body, data: &[u8], cuts: &[usize]) -> Result<(usize, Vec<u8>), Error> {
    let mut r = BodyReader::new(body, 64);
    let mut payload = Vec::new();
    let mut bounds: Vec<usize> = cuts.iter().map(|&c| c.min(data.len())).collect();
    bounds.push(data.len());
    bounds.sort_unstable();
    let (mut start, mut used) = (0, 0);
    for end in bounds {
        let piece = &data[start..end];
        let mut off = 0;
        while off < piece.len() && !r.is_done() {
            let step = r.advance(&piece[off..])?;
            payload.extend_from_slice(&piece[off..][step.payload]);
            off += step.consumed;
        }
        used += off;
        if r.is_done() {
            return Ok((used, payload));
        }
        start = end;
    }
    Ok((usize::MAX, payload))
}

/// A chunked encoding of `payload` in pieces of the given sizes, with optional extensions and
/// trailers, followed by `next` (the next message).
fn chunked(payload: &[u8], sizes: &[usize], ext: bool, trailer: bool) -> Vec<u8> {
    let mut out = Vec::new();
    let mut rest = payload;
    let mut i = 0;
    while !rest.is_empty() {
        let n = sizes
            .get(i)
            .copied()
            .unwrap_or(rest.len())
            .clamp(1, rest.len());
        out.extend_from_slice(format!("{n:x}").as_bytes());
        if ext {
            out.extend_from_slice(b";name=value");
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(&rest[..n]);
        out.extend_from_slice(b"\r\n");
        rest = &rest[n..];
        i += 1;
    }
    out.extend_from_slice(b"0\r\n");
    if trailer {
        out.extend_from_slice(b"X-Trailer: 1\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

proptest! {
    /// However the bytes are split into reads, a chunked body frames to the same end and
    /// decodes to the same payload, and the next message's bytes are left alone.
    #[test]
    fn chunked_split_reads(
        payload in proptest::collection::vec(any::<u8>(), 0..300),
        sizes in proptest::collection::vec(1usize..64, 0..10),
        cuts in proptest::collection::vec(0usize..400, 0..8),
        ext: bool,
        trailer: bool,
    ) {
        let body = chunked(&payload, &sizes, ext, trailer);
        let mut data = body.clone();
        data.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
        let (used, got) = feed(Body::Chunked, &data, &cuts).unwrap();
        prop_assert_eq!(used, body.len());
        prop_assert_eq!(got, payload);
    }

    /// A Content-Length body: the same for every split.
    #[test]
    fn length_split_reads(
        payload in proptest::collection::vec(any::<u8>(), 1..300),
        cuts in proptest::collection::vec(0usize..400, 0..8),
    ) {
        let mut data = payload.clone();
        data.extend_from_slice(b"next");
        let (used, got) = feed(Body::Length(payload.len() as u64), &data, &cuts).unwrap();
        prop_assert_eq!(used, payload.len());
        prop_assert_eq!(got, payload);
    }

    /// Whole responses: every prefix of a pipelined stream is incomplete or frames the same
    /// first response as the whole stream.
    #[test]
    fn response_prefixes(
        payload in proptest::collection::vec(any::<u8>(), 0..200),
        sizes in proptest::collection::vec(1usize..64, 0..6),
        use_chunked: bool,
    ) {
        let mut data = b"HTTP/1.1 200 OK\r\nServer: t\r\n".to_vec();
        if use_chunked {
            data.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
            data.extend_from_slice(&chunked(&payload, &sizes, false, false));
        } else {
            data.extend_from_slice(format!("Content-Length: {}\r\n\r\n", payload.len()).as_bytes());
            data.extend_from_slice(&payload);
        }
        let first = data.len();
        data.extend_from_slice(b"HTTP/1.1 204 No Content\r\n\r\n");
        let whole = resp(&data, false).unwrap().unwrap();
        prop_assert_eq!(whole.len, first);
        prop_assert_eq!(&whole.payload, &payload);
        for cut in 0..first {
            prop_assert_eq!(resp(&data[..cut], false).unwrap(), None, "cut {}", cut);
        }
    }

    /// Arbitrary bytes never panic the framers.
    #[test]
    fn never_panics(data in proptest::collection::vec(any::<u8>(), 0..200), head: bool) {
        let _ = req(&data);
        let _ = resp(&data, head);
        let _ = feed(Body::Chunked, &data, &[3, 7, 50]);
    }
}
