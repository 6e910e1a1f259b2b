//! The one lookup the observer needs in the kernel's BTF (pure: no I/O, never panics).
//!
//! A BTF-typed raw tracepoint program (`BPF_PROG_TYPE_TRACING`, attach type `BPF_TRACE_RAW_TP`)
//! names its tracepoint by the id of the typedef `btf_trace_<tracepoint>` in the kernel's own
//! BTF (`/sys/kernel/btf/vmlinux`). In exchange the verifier knows the tracepoint's argument
//! types, so the program reads `struct pt_regs` fields with plain loads instead of a
//! `bpf_probe_read_kernel` call each ([`crate::bpfprog`]).
//!
//! The format (`Documentation/bpf/btf.rst`): a header (magic `0xeB9F`, version, flags, header
//! length, then the offsets and lengths of the type and string sections, relative to the end
//! of the header); the type section is a sequence of 12-byte `struct btf_type` records (name
//! offset, info — kind in bits 24–28, count of members in bits 0–15 —, size or type), each
//! followed by data whose length depends on its kind; type ids count from 1 in that order.
#![forbid(unsafe_code)]
#![cfg_attr(
    not(test),
    deny(
        clippy::indexing_slicing,
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::arithmetic_side_effects
    )
)]

use crate::decode::{u16_at, u32_at};

const MAGIC: u16 = 0xeb9f;
const KIND_TYPEDEF: u32 = 8;

/// Bytes of kind-specific data after a type record of `kind` with `vlen` members; `None` for a
/// kind this reader does not know (a newer kernel's: the walk cannot go past it).
fn extra_len(kind: u32, vlen: usize) -> Option<usize> {
    match kind {
        1 | 14 | 17 => Some(4),                  // INT, VAR, DECL_TAG
        2 | 7..=12 | 16 | 18 => Some(0), // PTR, FWD, TYPEDEF, modifiers, FUNC, FLOAT, TYPE_TAG
        3 => Some(12),                   // ARRAY
        4 | 5 | 15 | 19 => vlen.checked_mul(12), // STRUCT, UNION, DATASEC, ENUM64
        6 | 13 => vlen.checked_mul(8),   // ENUM, FUNC_PROTO
        _ => None,
    }
}

/// The NUL-terminated string at `off` of the string section `strs`.
fn string_at(strs: &[u8], off: usize) -> Option<&[u8]> {
    let s = strs.get(off..)?;
    let end = s.iter().position(|&c| c == 0)?;
    s.get(..end)
}

/// The id of the typedef named `name` in the raw BTF `raw` (little-endian, as the running
/// kernel's), or why there is none.
pub fn typedef_id(raw: &[u8], name: &str) -> Result<u32, String> {
    let bad = || "malformed BTF".to_string();
    if u16_at(raw, 0) != Some(MAGIC) {
        return Err("not little-endian BTF (bad magic)".to_string());
    }
    let hdr = u32_at(raw, 4).ok_or_else(bad)? as usize;
    let field = |at: usize| u32_at(raw, at).map(|v| v as usize).ok_or_else(bad);
    let (type_off, type_len, str_off, str_len) = (field(8)?, field(12)?, field(16)?, field(20)?);
    let section = |off: usize, len: usize| {
        let start = hdr.checked_add(off)?;
        raw.get(start..start.checked_add(len)?)
    };
    let types = section(type_off, type_len).ok_or_else(bad)?;
    let strs = section(str_off, str_len).ok_or_else(bad)?;
    let mut at = 0usize;
    let mut id = 1u32;
    while at < types.len() {
        let (name_off, info) = (
            u32_at(types, at).ok_or_else(bad)?,
            u32_at(types, at.checked_add(4).ok_or_else(bad)?).ok_or_else(bad)?,
        );
        let kind = (info >> 24) & 0x1f;
        if kind == KIND_TYPEDEF && string_at(strs, name_off as usize) == Some(name.as_bytes()) {
            return Ok(id);
        }
        let extra = extra_len(kind, (info & 0xffff) as usize)
            .ok_or_else(|| format!("BTF type kind {kind} unknown to this reader (type {id})"))?;
        at = at
            .checked_add(12)
            .and_then(|a| a.checked_add(extra))
            .ok_or_else(bad)?;
        id = id.checked_add(1).ok_or_else(bad)?;
    }
    Err(format!("no typedef {name} in the kernel's BTF"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob of `types` (kind, vlen, name) with zeroed kind data, and its strings.
    fn blob(types: &[(u32, u32, &str)]) -> Vec<u8> {
        let mut strs = vec![0u8];
        let mut ty = Vec::new();
        for &(kind, vlen, name) in types {
            let off = strs.len() as u32;
            strs.extend_from_slice(name.as_bytes());
            strs.push(0);
            ty.extend_from_slice(&off.to_le_bytes());
            ty.extend_from_slice(&((kind << 24) | vlen).to_le_bytes());
            ty.extend_from_slice(&0u32.to_le_bytes());
            ty.resize(ty.len() + extra_len(kind, vlen as usize).unwrap(), 0);
        }
        let mut b = Vec::new();
        b.extend_from_slice(&MAGIC.to_le_bytes());
        b.extend_from_slice(&[1, 0]);
        b.extend_from_slice(&24u32.to_le_bytes());
        for v in [0, ty.len() as u32, ty.len() as u32, strs.len() as u32] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&ty);
        b.extend_from_slice(&strs);
        b
    }

    #[test]
    fn finds_a_typedef_after_types_of_every_size() {
        let b = blob(&[
            (1, 0, "int"),
            (4, 3, "pt_regs"),
            (13, 2, ""),
            (6, 5, "e"),
            (8, 0, "btf_trace_sys_enter"),
            (8, 0, "btf_trace_sys_exit"),
        ]);
        assert_eq!(typedef_id(&b, "btf_trace_sys_enter"), Ok(5));
        assert_eq!(typedef_id(&b, "btf_trace_sys_exit"), Ok(6));
        // A struct of that name is no typedef.
        assert!(typedef_id(&b, "pt_regs")
            .unwrap_err()
            .contains("no typedef"));
    }

    #[test]
    fn bad_input_is_an_error_never_a_panic() {
        assert!(typedef_id(&[], "x").is_err());
        assert!(typedef_id(&[0x9f, 0xeb], "x").is_err());
        let b = blob(&[(4, 3, "s"), (8, 0, "t")]);
        for n in 0..b.len() {
            let _ = typedef_id(&b[..n], "t");
        }
        let mut unknown = blob(&[(8, 0, "z"), (8, 0, "t")]);
        unknown[24 + 4 + 3] = 31;
        assert!(typedef_id(&unknown, "t").unwrap_err().contains("unknown"));
    }

    #[test]
    fn the_running_kernels_btf_has_the_syscall_tracepoints_where_readable() {
        let Ok(raw) = std::fs::read("/sys/kernel/btf/vmlinux") else {
            return; // no BTF here: nothing to check (the observer falls back)
        };
        assert!(typedef_id(&raw, "btf_trace_sys_enter").is_ok());
        assert!(typedef_id(&raw, "btf_trace_sys_exit").is_ok());
    }
}
