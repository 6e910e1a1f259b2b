/*
 * phtrace: a Valgrind tool that records, per client thread, the set of
 * distinct 64-byte cache lines touched (instruction fetches and data
 * loads/stores) during *busy periods*, and appends one binary record per
 * period to a dump file.  Part of preheat (crates/preheat-trace).
 *
 * Busy period contract
 * --------------------
 * A thread's busy period starts when one of its event-wait system calls
 * (epoll_wait, epoll_pwait, epoll_pwait2, poll, ppoll, select, pselect6)
 * returns a value > 0, and ends when the same thread next enters one of these
 * system calls.  Only user-space accesses of the client are seen; the kernel
 * and Valgrind itself are invisible.
 *
 * With --phtrace-all=yes every thread is always recording and a record is
 * written each time the thread enters an event-wait system call (so the
 * records partition the thread's whole execution, start-up included).
 *
 * Record format (little endian, natural C layout, 40-byte header):
 *   u32 magic = 0x50485452 ('PHTR')
 *   u16 version = 1
 *   u16 kind     1 = complete period, 2 = incomplete (thread/program exit)
 *   u32 tid      Linux thread id (LWP) of the client thread
 *   u32 pad      zero
 *   u64 seq      global record sequence number (0, 1, 2, ... across threads)
 *   u64 instructions   guest instructions executed in the period
 *   u64 nlines
 *   u64 lines[nlines]  line addresses (addr & ~63), sorted ascending
 *
 * Each record is written with one open(O_APPEND)/write/close as soon as the
 * period ends, so a reader sees it immediately; a reader must tolerate a
 * partially written trailing record.
 *
 * Fast path: two small direct-mapped "recently seen line" filters (code,
 * data) are checked inline in the generated code; the helper that inserts
 * into the per-thread hash set is only called on a filter miss.  Filters are
 * cleared whenever the running thread changes or a period starts, so they
 * never hide a line from the set of the current period.
 */

#include "pub_tool_basics.h"
#include "pub_tool_tooliface.h"
#include "pub_tool_libcassert.h"
#include "pub_tool_libcprint.h"
#include "pub_tool_libcbase.h"
#include "pub_tool_libcfile.h"
#include "pub_tool_libcproc.h"
#include "pub_tool_mallocfree.h"
#include "pub_tool_options.h"
#include "pub_tool_machine.h"
#include "pub_tool_threadstate.h"
#include "pub_tool_vki.h"
#include "pub_tool_vkiscnums.h"

#define PH_MAGIC        0x50485452u
#define PH_VERSION      1
#define PH_KIND_BUSY    1
#define PH_KIND_PARTIAL 2
#define PH_HEADER_BYTES 40

#define LINE_SHIFT  6
#define FILTER_BITS 12
#define FILTER_SIZE (1u << FILTER_BITS)
#define FILTER_MASK ((ULong)(FILTER_SIZE - 1))
#define NO_LINE     (~(ULong)0)

#define SET_MIN_CAP 1024

/*------------------------------------------------------------*/
/*--- Options                                              ---*/
/*------------------------------------------------------------*/

static const HChar* clo_out = "phtrace.%p.bin";
static Bool clo_all = False;

static HChar* out_path = NULL;

static Bool ph_process_cmd_line_option(const HChar* arg)
{
   if VG_STR_CLO(arg, "--phtrace-out", clo_out) {}
   else if VG_BOOL_CLO(arg, "--phtrace-all", clo_all) {}
   else
      return False;
   return True;
}

static void ph_print_usage(void)
{
   VG_(printf)(
"    --phtrace-out=FILE        append busy-period records to FILE [phtrace.%%p.bin]\n"
"    --phtrace-all=no|yes      record everything, one record per event-wait\n"
"                              syscall entry, instead of busy periods only [no]\n");
}

static void ph_print_debug_usage(void)
{
   VG_(printf)("    (none)\n");
}

/*------------------------------------------------------------*/
/*--- Per-thread state                                     ---*/
/*------------------------------------------------------------*/

typedef struct {
   Bool   used;
   Bool   busy;
   Int    lwp;
   ULong  icount;        /* instructions executed so far (folded) */
   ULong  icount_start;  /* icount at the start of the current period */
   ULong* set;           /* open addressing table of line numbers */
   ULong  cap;           /* power of two, 0 if not allocated */
   ULong  n;
} ThreadState;

static ThreadState* threads = NULL;
static UInt n_threads = 0;

/* The thread currently running client code (threads are serialised). */
static ThreadState* cur = NULL;
/* The thread whose accesses the filters currently describe. */
static ThreadId filter_owner = VG_INVALID_THREADID;

/* Updated by generated code. */
static ULong g_icount = 0;
static ULong icache[FILTER_SIZE];
static ULong dcache[FILTER_SIZE];

/* Statistics. */
static ULong st_records = 0;
static ULong st_partial = 0;
static ULong st_bytes = 0;
static ULong st_write_errors = 0;
static ULong st_helper_calls = 0;

static void filters_clear(void)
{
   VG_(memset)(icache, 0xFF, sizeof(icache));
   VG_(memset)(dcache, 0xFF, sizeof(dcache));
}

static void fold_icount(void)
{
   if (cur != NULL)
      cur->icount += g_icount;
   g_icount = 0;
}

static ThreadState* get_ts(ThreadId tid)
{
   ThreadState* ts;
   tl_assert(tid < n_threads);
   ts = &threads[tid];
   if (!ts->used) {
      VG_(memset)(ts, 0, sizeof(*ts));
      ts->used = True;
      ts->busy = clo_all;
      ts->lwp = -1;
   }
   return ts;
}

static void set_alloc(ThreadState* ts, ULong cap)
{
   ts->set = VG_(malloc)("phtrace.set", cap * sizeof(ULong));
   VG_(memset)(ts->set, 0xFF, cap * sizeof(ULong));
   ts->cap = cap;
   ts->n = 0;
}

static void set_free(ThreadState* ts)
{
   if (ts->set != NULL)
      VG_(free)(ts->set);
   ts->set = NULL;
   ts->cap = 0;
   ts->n = 0;
}

static inline ULong hash_line(ULong l)
{
   l *= 0x9E3779B97F4A7C15ULL;
   return l ^ (l >> 29);
}

static void set_insert_raw(ULong* set, ULong cap, ULong line)
{
   ULong mask = cap - 1;
   ULong i = hash_line(line) & mask;
   while (set[i] != NO_LINE)
      i = (i + 1) & mask;
   set[i] = line;
}

static void set_grow(ThreadState* ts)
{
   ULong old_cap = ts->cap, i, new_cap = old_cap * 2;
   ULong* old = ts->set;
   ULong* neu = VG_(malloc)("phtrace.set", new_cap * sizeof(ULong));
   VG_(memset)(neu, 0xFF, new_cap * sizeof(ULong));
   for (i = 0; i < old_cap; i++)
      if (old[i] != NO_LINE)
         set_insert_raw(neu, new_cap, old[i]);
   VG_(free)(old);
   ts->set = neu;
   ts->cap = new_cap;
}

static void set_add(ThreadState* ts, ULong line)
{
   ULong mask, i;
   if (ts->set == NULL)
      set_alloc(ts, SET_MIN_CAP);
   mask = ts->cap - 1;
   i = hash_line(line) & mask;
   while (ts->set[i] != NO_LINE) {
      if (ts->set[i] == line)
         return;
      i = (i + 1) & mask;
   }
   ts->set[i] = line;
   ts->n++;
   if (2 * ts->n > ts->cap)
      set_grow(ts);
}

/* Empty the set; shrink it if a previous period made it much larger than
   the usual. */
static void set_reset(ThreadState* ts)
{
   if (ts->set == NULL)
      return;
   if (ts->cap > SET_MIN_CAP && ts->cap > 8 * ts->n) {
      ULong cap = SET_MIN_CAP;
      while (2 * ts->n > cap)
         cap *= 2;
      set_free(ts);
      set_alloc(ts, cap);
   } else {
      VG_(memset)(ts->set, 0xFF, ts->cap * sizeof(ULong));
      ts->n = 0;
   }
}

/*------------------------------------------------------------*/
/*--- Dumping                                              ---*/
/*------------------------------------------------------------*/

static ULong next_seq = 0;

static Int cmp_ulong(const void* a, const void* b)
{
   ULong x = *(const ULong*)a, y = *(const ULong*)b;
   return x < y ? -1 : (x > y ? 1 : 0);
}

static void put_u16(UChar* p, UShort v) { p[0] = v & 0xFF; p[1] = v >> 8; }
static void put_u32(UChar* p, UInt v)
{
   Int i;
   for (i = 0; i < 4; i++) p[i] = (v >> (8 * i)) & 0xFF;
}
static void put_u64(UChar* p, ULong v)
{
   Int i;
   for (i = 0; i < 8; i++) p[i] = (v >> (8 * i)) & 0xFF;
}

static void write_all(const UChar* buf, ULong len)
{
   Int fd;
   if (out_path == NULL)
      return;
   fd = VG_(fd_open)(out_path, VKI_O_WRONLY | VKI_O_APPEND | VKI_O_CREAT, 0644);
   if (fd < 0) {
      if (st_write_errors++ == 0)
         VG_(umsg)("phtrace: cannot open %s for appending\n", out_path);
      return;
   }
   while (len > 0) {
      Int chunk = len > (1u << 30) ? (1 << 30) : (Int)len;
      Int w = VG_(write)(fd, buf, chunk);
      if (w <= 0) {
         if (st_write_errors++ == 0)
            VG_(umsg)("phtrace: write to %s failed\n", out_path);
         break;
      }
      buf += w;
      len -= (ULong)w;
      st_bytes += (ULong)w;
   }
   VG_(close)(fd);
}

static void dump_period(ThreadState* ts, UShort kind)
{
   ULong i, j = 0, n = ts->n;
   ULong bytes = PH_HEADER_BYTES + 8 * n;
   UChar* buf = VG_(malloc)("phtrace.dump", bytes);
   ULong* lines = VG_(malloc)("phtrace.lines", (n ? n : 1) * sizeof(ULong));

   for (i = 0; i < ts->cap; i++)
      if (ts->set[i] != NO_LINE)
         lines[j++] = ts->set[i] << LINE_SHIFT;
   tl_assert(j == n);
   if (n > 1)
      VG_(ssort)(lines, n, sizeof(ULong), cmp_ulong);

   put_u32(buf + 0, PH_MAGIC);
   put_u16(buf + 4, PH_VERSION);
   put_u16(buf + 6, kind);
   put_u32(buf + 8, (UInt)ts->lwp);
   put_u32(buf + 12, 0);
   put_u64(buf + 16, next_seq++);
   put_u64(buf + 24, ts->icount - ts->icount_start);
   put_u64(buf + 32, n);
   for (i = 0; i < n; i++)
      put_u64(buf + PH_HEADER_BYTES + 8 * i, lines[i]);

   write_all(buf, bytes);
   st_records++;
   if (kind == PH_KIND_PARTIAL)
      st_partial++;
   VG_(free)(lines);
   VG_(free)(buf);
}

static void period_start(ThreadState* ts)
{
   set_reset(ts);
   ts->icount_start = ts->icount;
   ts->busy = True;
   filters_clear();
}

/*------------------------------------------------------------*/
/*--- Helpers called from generated code                   ---*/
/*------------------------------------------------------------*/

static VG_REGPARM(1) void ph_code_line(ULong line)
{
   st_helper_calls++;
   icache[line & FILTER_MASK] = line;
   if (cur != NULL && cur->busy)
      set_add(cur, line);
}

static VG_REGPARM(2) void ph_data(Addr addr, ULong size)
{
   ULong first = (ULong)addr >> LINE_SHIFT;
   ULong last = ((ULong)addr + (size ? size - 1 : 0)) >> LINE_SHIFT;
   ULong l;
   Bool rec = cur != NULL && cur->busy;
   st_helper_calls++;
   if (last < first)
      last = first;
   for (l = first;; l++) {
      dcache[l & FILTER_MASK] = l;
      if (rec)
         set_add(cur, l);
      if (l == last)
         break;
   }
}

/*------------------------------------------------------------*/
/*--- Instrumentation                                      ---*/
/*------------------------------------------------------------*/

static IRTemp new_tmp(IRSB* sb, IRType ty, IRExpr* e)
{
   IRTemp t = newIRTemp(sb->tyenv, ty);
   addStmtToIRSB(sb, IRStmt_WrTmp(t, e));
   return t;
}

static IRExpr* u64(ULong v) { return IRExpr_Const(IRConst_U64(v)); }
static IRExpr* u8(UChar v) { return IRExpr_Const(IRConst_U8(v)); }

/* g_icount += n */
static void emit_icount(IRSB* sb, ULong n)
{
   IRExpr* at = mkIRExpr_HWord((HWord)&g_icount);
   IRTemp a = new_tmp(sb, Ity_I64, IRExpr_Load(Iend_LE, Ity_I64, at));
   IRTemp b = new_tmp(sb, Ity_I64,
                      IRExpr_Binop(Iop_Add64, IRExpr_RdTmp(a), u64(n)));
   addStmtToIRSB(sb, IRStmt_Store(Iend_LE, mkIRExpr_HWord((HWord)&g_icount),
                                  IRExpr_RdTmp(b)));
}

/* if (icache[line & MASK] != line) ph_code_line(line) */
static void emit_code_line(IRSB* sb, ULong line)
{
   IRExpr* slot = mkIRExpr_HWord((HWord)&icache[line & FILTER_MASK]);
   IRTemp old = new_tmp(sb, Ity_I64, IRExpr_Load(Iend_LE, Ity_I64, slot));
   IRTemp miss = new_tmp(sb, Ity_I1,
                         IRExpr_Binop(Iop_CmpNE64, IRExpr_RdTmp(old), u64(line)));
   IRDirty* d = unsafeIRDirty_0_N(1, "ph_code_line",
                                  VG_(fnptr_to_fnentry)(ph_code_line),
                                  mkIRExprVec_1(u64(line)));
   d->guard = IRExpr_RdTmp(miss);
   addStmtToIRSB(sb, IRStmt_Dirty(d));
}

/* Unfiltered (optionally guarded) call for unusual accesses. */
static void emit_data_plain(IRSB* sb, IRExpr* addr, ULong size, IRExpr* guard)
{
   IRDirty* d;
   tl_assert(isIRAtom(addr));
   d = unsafeIRDirty_0_N(2, "ph_data", VG_(fnptr_to_fnentry)(ph_data),
                         mkIRExprVec_2(addr, u64(size)));
   if (guard != NULL)
      d->guard = guard;
   addStmtToIRSB(sb, IRStmt_Dirty(d));
}

/* line = addr >> 6;
   if (dcache[line & MASK] != line || line != (addr+size-1) >> 6)
      ph_data(addr, size) */
static void emit_data(IRSB* sb, IRExpr* addr, ULong size)
{
   IRTemp line, idx, off, slot, old, miss, g;
   IRDirty* d;
   tl_assert(isIRAtom(addr));
   if (size == 0)
      return;
   if (size > 64) {
      emit_data_plain(sb, addr, size, NULL);
      return;
   }
   line = new_tmp(sb, Ity_I64, IRExpr_Binop(Iop_Shr64, addr, u8(LINE_SHIFT)));
   idx = new_tmp(sb, Ity_I64,
                 IRExpr_Binop(Iop_And64, IRExpr_RdTmp(line), u64(FILTER_MASK)));
   off = new_tmp(sb, Ity_I64, IRExpr_Binop(Iop_Shl64, IRExpr_RdTmp(idx), u8(3)));
   slot = new_tmp(sb, Ity_I64,
                  IRExpr_Binop(Iop_Add64, IRExpr_RdTmp(off),
                               u64((ULong)(HWord)&dcache[0])));
   old = new_tmp(sb, Ity_I64, IRExpr_Load(Iend_LE, Ity_I64, IRExpr_RdTmp(slot)));
   miss = new_tmp(sb, Ity_I1,
                  IRExpr_Binop(Iop_CmpNE64, IRExpr_RdTmp(old), IRExpr_RdTmp(line)));
   g = miss;
   if (size > 1) {
      IRTemp end = new_tmp(sb, Ity_I64, IRExpr_Binop(Iop_Add64, addr, u64(size - 1)));
      IRTemp lend = new_tmp(sb, Ity_I64,
                            IRExpr_Binop(Iop_Shr64, IRExpr_RdTmp(end), u8(LINE_SHIFT)));
      IRTemp cross = new_tmp(sb, Ity_I1,
                             IRExpr_Binop(Iop_CmpNE64, IRExpr_RdTmp(line),
                                          IRExpr_RdTmp(lend)));
      g = new_tmp(sb, Ity_I1,
                  IRExpr_Binop(Iop_Or1, IRExpr_RdTmp(miss), IRExpr_RdTmp(cross)));
   }
   d = unsafeIRDirty_0_N(2, "ph_data", VG_(fnptr_to_fnentry)(ph_data),
                         mkIRExprVec_2(addr, u64(size)));
   d->guard = IRExpr_RdTmp(g);
   addStmtToIRSB(sb, IRStmt_Dirty(d));
}

/* Number of IMarks from stmts[from] up to the next side exit (or the end):
   once the first of them starts executing, all of them do (barring faults). */
static ULong segment_insns(const IRSB* sb, Int from)
{
   ULong n = 0;
   Int j;
   for (j = from; j < sb->stmts_used; j++) {
      const IRStmt* s = sb->stmts[j];
      if (s == NULL)
         continue;
      if (s->tag == Ist_IMark)
         n++;
      else if (s->tag == Ist_Exit)
         break;
   }
   return n;
}

#define MAX_SEEN 512

static IRSB* ph_instrument(VgCallbackClosure* closure, IRSB* sbIn,
                           const VexGuestLayout* layout,
                           const VexGuestExtents* vge,
                           const VexArchInfo* archinfo_host,
                           IRType gWordTy, IRType hWordTy)
{
   IRSB* sbOut;
   IRTypeEnv* tyenv;
   Int i, k, nseen = 0;
   Bool in_segment = False;
   ULong seen[MAX_SEEN];

   if (gWordTy != Ity_I64 || hWordTy != Ity_I64)
      VG_(tool_panic)("phtrace supports 64-bit guests and hosts only");

   sbOut = deepCopyIRSBExceptStmts(sbIn);
   tyenv = sbOut->tyenv;

   i = 0;
   while (i < sbIn->stmts_used && sbIn->stmts[i]->tag != Ist_IMark) {
      addStmtToIRSB(sbOut, sbIn->stmts[i]);
      i++;
   }

   for (; i < sbIn->stmts_used; i++) {
      IRStmt* st = sbIn->stmts[i];
      if (st == NULL || st->tag == Ist_NoOp)
         continue;

      switch (st->tag) {
      case Ist_IMark: {
         ULong a = (ULong)st->Ist.IMark.addr;
         ULong len = st->Ist.IMark.len ? st->Ist.IMark.len : 1;
         ULong l, l0 = a >> LINE_SHIFT, l1 = (a + len - 1) >> LINE_SHIFT;
         addStmtToIRSB(sbOut, st);
         if (!in_segment) {
            emit_icount(sbOut, segment_insns(sbIn, i));
            in_segment = True;
         }
         for (l = l0; l <= l1; l++) {
            Bool dup = False;
            /* Every earlier IMark of this superblock has executed when this
               one does, so a line already emitted here is already recorded. */
            for (k = 0; k < nseen; k++)
               if (seen[k] == l) { dup = True; break; }
            if (dup)
               continue;
            if (nseen < MAX_SEEN)
               seen[nseen++] = l;
            emit_code_line(sbOut, l);
         }
         break;
      }

      case Ist_WrTmp: {
         IRExpr* data = st->Ist.WrTmp.data;
         if (data->tag == Iex_Load)
            emit_data(sbOut, data->Iex.Load.addr, sizeofIRType(data->Iex.Load.ty));
         addStmtToIRSB(sbOut, st);
         break;
      }

      case Ist_Store: {
         IRType ty = typeOfIRExpr(tyenv, st->Ist.Store.data);
         emit_data(sbOut, st->Ist.Store.addr, sizeofIRType(ty));
         addStmtToIRSB(sbOut, st);
         break;
      }

      case Ist_StoreG: {
         IRStoreG* sg = st->Ist.StoreG.details;
         IRType ty = typeOfIRExpr(tyenv, sg->data);
         emit_data_plain(sbOut, sg->addr, sizeofIRType(ty), sg->guard);
         addStmtToIRSB(sbOut, st);
         break;
      }

      case Ist_LoadG: {
         IRLoadG* lg = st->Ist.LoadG.details;
         IRType ty = Ity_INVALID, wide = Ity_INVALID;
         typeOfIRLoadGOp(lg->cvt, &wide, &ty);
         tl_assert(ty != Ity_INVALID);
         emit_data_plain(sbOut, lg->addr, sizeofIRType(ty), lg->guard);
         addStmtToIRSB(sbOut, st);
         break;
      }

      case Ist_Dirty: {
         IRDirty* d = st->Ist.Dirty.details;
         if (d->mFx != Ifx_None) {
            tl_assert(d->mAddr != NULL && d->mSize != 0);
            emit_data_plain(sbOut, d->mAddr, d->mSize,
                            isIRAtom(d->guard) ? d->guard : NULL);
         }
         addStmtToIRSB(sbOut, st);
         break;
      }

      case Ist_CAS: {
         IRCAS* cas = st->Ist.CAS.details;
         ULong size = sizeofIRType(typeOfIRExpr(tyenv, cas->dataLo));
         if (cas->dataHi != NULL)
            size *= 2;
         emit_data(sbOut, cas->addr, size);
         addStmtToIRSB(sbOut, st);
         break;
      }

      case Ist_LLSC: {
         IRType ty;
         if (st->Ist.LLSC.storedata == NULL)
            ty = typeOfIRTemp(tyenv, st->Ist.LLSC.result);
         else
            ty = typeOfIRExpr(tyenv, st->Ist.LLSC.storedata);
         emit_data(sbOut, st->Ist.LLSC.addr, sizeofIRType(ty));
         addStmtToIRSB(sbOut, st);
         break;
      }

      case Ist_Exit:
         addStmtToIRSB(sbOut, st);
         in_segment = False;
         break;

      default:
         addStmtToIRSB(sbOut, st);
         break;
      }
   }
   return sbOut;
}

/*------------------------------------------------------------*/
/*--- Scheduling, syscalls, threads                        ---*/
/*------------------------------------------------------------*/

static void ph_start_client_code(ThreadId tid, ULong blocks_done)
{
   ThreadState* ts;
   fold_icount();
   ts = get_ts(tid);
   if (ts->lwp < 0)
      ts->lwp = VG_(gettid)();
   cur = ts;
   if (filter_owner != tid) {
      filters_clear();
      filter_owner = tid;
   }
}

static void ph_stop_client_code(ThreadId tid, ULong blocks_done)
{
   fold_icount();
}

static Bool is_event_wait(UInt sysno)
{
   switch (sysno) {
#if defined(__NR_epoll_wait)
   case __NR_epoll_wait:
#endif
#if defined(__NR_epoll_pwait)
   case __NR_epoll_pwait:
#endif
#if defined(__NR_poll)
   case __NR_poll:
#endif
#if defined(__NR_ppoll)
   case __NR_ppoll:
#endif
#if defined(__NR_select)
   case __NR_select:
#endif
#if defined(__NR_pselect6)
   case __NR_pselect6:
#endif
   case 441: /* epoll_pwait2 (same number on every Linux architecture) */
      return True;
   default:
      return False;
   }
}

static void ph_pre_syscall(ThreadId tid, UInt sysno, UWord* args, UInt nargs)
{
   ThreadState* ts;
   if (!is_event_wait(sysno))
      return;
   fold_icount();
   ts = get_ts(tid);
   if (ts->lwp < 0)
      ts->lwp = VG_(gettid)();
   if (!ts->busy)
      return;
   dump_period(ts, PH_KIND_BUSY);
   if (clo_all) {
      period_start(ts);
   } else {
      ts->busy = False;
   }
}

static void ph_post_syscall(ThreadId tid, UInt sysno, UWord* args, UInt nargs,
                            SysRes res)
{
   ThreadState* ts;
   if (!is_event_wait(sysno) || clo_all)
      return;
   if (sr_isError(res) || (Word)sr_Res(res) <= 0)
      return;
   fold_icount();
   ts = get_ts(tid);
   cur = ts;
   period_start(ts);
   filter_owner = tid;
}

static void ph_thread_exit(ThreadId tid)
{
   ThreadState* ts;
   if (tid >= n_threads || !threads[tid].used)
      return;
   fold_icount();
   ts = &threads[tid];
   if (ts->busy)
      dump_period(ts, PH_KIND_PARTIAL);
   set_free(ts);
   ts->used = False;
   if (cur == ts)
      cur = NULL;
   if (filter_owner == tid)
      filter_owner = VG_INVALID_THREADID;
}

/*------------------------------------------------------------*/
/*--- Start-up and shutdown                                ---*/
/*------------------------------------------------------------*/

static void ph_post_clo_init(void)
{
   Int fd;
   n_threads = VG_N_THREADS;
   threads = VG_(calloc)("phtrace.threads", n_threads, sizeof(ThreadState));
   filters_clear();
   out_path = VG_(expand_file_name)("--phtrace-out", clo_out);
   fd = VG_(fd_open)(out_path, VKI_O_WRONLY | VKI_O_CREAT | VKI_O_TRUNC, 0644);
   if (fd < 0) {
      VG_(fmsg)("phtrace: cannot create output file %s\n", out_path);
      VG_(exit)(1);
   }
   VG_(close)(fd);
   if (VG_(clo_verbosity) > 0)
      VG_(umsg)("phtrace: writing %s records to %s\n",
                clo_all ? "all-execution" : "busy-period", out_path);
}

static void ph_fini(Int exitcode)
{
   UInt t;
   fold_icount();
   for (t = 0; t < n_threads; t++) {
      ThreadState* ts = &threads[t];
      if (ts->used && ts->busy)
         dump_period(ts, PH_KIND_PARTIAL);
   }
   if (VG_(clo_verbosity) > 0)
      VG_(umsg)("phtrace: %llu records (%llu incomplete), %llu bytes, "
                "%llu helper calls, %llu write errors\n",
                st_records, st_partial, st_bytes, st_helper_calls,
                st_write_errors);
}

static void ph_pre_clo_init(void)
{
   VG_(details_name)("phtrace");
   VG_(details_version)("0.1");
   VG_(details_description)("busy-period cache-line working sets (preheat)");
   VG_(details_copyright_author)("Copyright (C) the preheat authors.");
   VG_(details_bug_reports_to)("the preheat project");
   VG_(details_avg_translation_sizeB)(400);

   VG_(basic_tool_funcs)(ph_post_clo_init, ph_instrument, ph_fini);
   VG_(needs_command_line_options)(ph_process_cmd_line_option,
                                   ph_print_usage, ph_print_debug_usage);
   VG_(needs_syscall_wrapper)(ph_pre_syscall, ph_post_syscall);
   VG_(track_start_client_code)(ph_start_client_code);
   VG_(track_stop_client_code)(ph_stop_client_code);
   VG_(track_pre_thread_ll_exit)(ph_thread_exit);
}

VG_DETERMINE_INTERFACE_VERSION(ph_pre_clo_init)
