//! The bundled server's hard limits, memcached's where it has one.

/// Maximum simultaneous client connections (memcached's default `-c 1024`).
pub const MAX_CONNS: usize = 1024;
/// Maximum unparsed input buffered per connection. Must exceed the largest
/// legal request: a `MAX_LINE_LEN` command line plus a `MAX_VALUE_LEN` value.
pub const MAX_INBUF: usize = 2 * 1024 * 1024;
/// Stop executing a connection's requests while this much output is unsent.
pub const OUT_HIGH_WATER: usize = 4 * 1024 * 1024;
/// Largest reply to a single `get`.
pub const MAX_GET_RESPONSE: usize = 16 * 1024 * 1024;
