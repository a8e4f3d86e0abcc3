using System;
using System.Buffers.Binary;
using System.Numerics;
using System.Runtime.CompilerServices;

namespace Epvs.Persistence;

/// <summary>
/// The persistent layout of an EPVS heap file, format version 11 (older files are refused: version 2 added the
/// sealed superblock words and the heap kind, version 3 the sealed blocks, XxHash3 block checks and zeroed segments,
/// version 4 a checked word in every state: no all-zero descriptor or commit word is valid, version 5 descriptors
/// bound to their slot: a descriptor copied or moved into another slot of the table fails its check, version 6 sealed
/// words carrying their version's low bits, so that a buffered heap seals a version in the pass that writes it back,
/// version 7 an empty mark bound to the offset, not 0, in the Epoch word of every block that holds no payload, version 8
/// a key-size record for structures with keys of 31 bytes or more, version 9 a 48-byte size class below the 64-byte one,
/// which renumbers the class index every small segment's descriptor holds, version 10 the sweep log, between the table
/// and the segments, through which a buffered heap's sweeps make their frees durable, version 11 block checks in CRC-32C
/// instead of XxHash3, which every allocation, seal, free and recovery computes: a third of the cost for a header and
/// a small payload). Every persistent field is an 8-byte little-endian
/// word at an 8-byte aligned offset, written with a single aligned store, so it is failure-atomic: after a crash it
/// holds an old or a new value, never a mix. Persistent data holds offsets from the start of the file, never pointers.
/// </summary>
/// <remarks>
/// <code>
/// File:   [0, 4096)                      superblock
///         [4096, LogStart)               segment table: MaxSegments descriptors of 8 bytes (rounded up to 4096)
///         [LogStart, DataStart)          sweep log (format 10): two halves, see SweepLog; its size chosen at creation
///         [DataStart + i*65536, +65536)  segment i, for i &lt; SegmentCount = (HeapSize - DataStart) / 65536
///
/// Sealed words: value in bits 0..41, the low 22 bits of CRC-32(value, offset) in bits 42..63 (see Seal), so a word
/// rewritten in place stays failure-atomic and a damaged one is detected instead of trusted.
///
/// Superblock (offset: word)
///     0  Magic            0x5041_4548_5356_5045, "EPVSHEAP" in ASCII; written last at creation
///     8  FormatVersion    11 (11: block checks in CRC-32C; 10: the sweep log; 9: the 48-byte size class, class indexes
///                         renumbered; 8: structures with keys of 31 bytes or more keep a key-size record)
///    16  HeapSize         bytes in use: DataStart + SegmentCount*65536; grows (store + persist) after the file grew (sealed)
///    24  SegmentSize      65536
///    32  MaxSegments      capacity of the segment table
///    40  DataStart        offset of segment 0
///    48  GeometryCheck    XxHash3 of words 0, 8, 24, 32, 40 (detects a damaged superblock)
///    56  CleanShutdown    1 after an orderly Dispose, set to 0 (and persisted) as soon as a heap is opened (sealed)
///    64  EpochClock       the persisted epoch clock of buffered durability (part 2): at least every version begun;
///                         DurableFrontier + 2 (persisted with it: + 3 if a crash split the pair); 0 at creation (sealed)
///    72  DurableFrontier  the persisted durable frontier (part 2); 0 at creation (sealed)
///    80  SavedState       offset of the saved allocator state of a clean shutdown (0: none); cleared durably at open
///    88  SavedStateWords  its length in 8-byte words
///    96  SavedStateCheck  XxHash3 of its words, seeded with its offset
///   104  HeapKind         which heap owns the file: 0 none yet, 1 PersistentHeap, 2 BufferedDurableHeap (sealed);
///                         set by the first open, and opening the file as the other kind fails
///   112  SealedFrontier   the version through which every block of a buffered heap is sealed; made durable with each
///                         cycle's seals, before its frontier; below DurableFrontier only in a file written before
///                         that order or when damaged (recovery then takes torn blocks for damage) (sealed)
///   120  SalvagedThrough  the last version a salvage kept payloads of, persisted before it frees anything; the
///                         structures resolve a salvage's duplicates and gaps among payloads up to it; 0: never (sealed)
///   128  Root[0..15]      16 root words for the structures built on the heap (PayloadRef offsets or anything);
///                         durable at once, outside a buffered heap's versions (see HeapFile.SetRoot)
///   256  SweepLogEpoch    seeds every check of the sweep log's batches; raised, durably, by every recovery scan of a
///                         buffered heap once it has written the frees the log held; drawn at random below 2^31 at
///                         creation, so a heap created over another's bytes never reads that heap's batches (sealed)
///   320  SweepLogMarks    two records of 64 bytes (320, 384), written in turn by a buffered heap's cycles: the log's
///                         epoch, then each half's lap and where its batches ended when the cycle ran, and an XxHash3
///                         check of those five words seeded with the record's offset. Every batch before a recorded
///                         end was durable, so recovery takes a half whose valid batches end short of a record of
///                         its lap and the current epoch for damage, not for an append a crash tore. A record that
///                         fails its check (torn by a crash, or zero in a file written before records existed) or holds
///                         another epoch says nothing (see SweepLog)
///
/// Segment descriptor (table word i; every i &lt; SegmentCount holds one, written when the heap is created or grows)
///   bits  0..23  Generation   incremented (mod 2^24) every time the descriptor is rewritten; 0 when created
///   bits 24..31  Check        with bits 36..39: the low 12 bits of CRC-32 of the other bits (bits 24..31 and 36..39
///                             zero) and of the segment's index i (XOR a constant), as two 8-byte little-endian words:
///                             a descriptor is valid in its own slot only, so one copied or swapped into another slot
///                             (whose segment it would make recovery read with another block size) is damage
///   bits 32..35  Role         8 free, 9 small (one size class), 10 large start, 11 large continuation: bit 35 is set
///                             in every descriptor, so the all-zero word is damage in every slot
///   bits 40..63  Class index (small: into SizeClasses.BlockSizes, 48, 64, 96, ... 16384 bytes) or span in segments (large start)
///
/// Block (small: at segment start + k*BlockSize; large: at the start of its first segment)
///   +0   Uid     word 0: the payload's logical identity (kept by UPDATE copies and by DELETE anti-payloads)
///   +8   Epoch   word 1: the EPVS version the payload was written in (part 2); when the block holds no payload, its
///                empty mark EmptyEpoch(offset) = 0xE9E7 &lt;&lt; 48 XOR offset (formatting and a buffered heap's frees
///                write it; a raw heap's frees leave the version)
///   +16  Shape   word 2: bits 0..31 payload size in bytes, bits 32..63 type id
///   +24  Commit  word 3: bits 0..31 check, 32..47 generation (low 16 bits; in a sealed word the low 16 bits of
///                the Epoch word instead: the version tag), 48..51 kind (1 alloc, 2 update, 3 delete; 0 when unused or
///                free), 52..55 state (1 allocated, 2 free, 4 sealed, 8 unused: pairwise two bits apart), 56..63 tag 0xB7
///   +32  payload (size bytes)
/// </code>
/// <para>Checks (format 11: CRC-32C, the Castagnoli CRC of iSCSI, ext4 and Btrfs, over little-endian words, computed
/// by the processor's CRC instruction through <see cref="BitOperations.Crc32C(uint, ulong)"/>). Allocated: of Uid,
/// Epoch, Shape, the block's offset XOR (full generation &lt;&lt; 40) and the commit's other bits (tag, state,
/// generation, kind): five words. Sealed: of the same five words (with the sealed commit's bits) followed by the
/// payload's bytes, or, for a payload of more than <see cref="RawCheckedPayload"/> bytes, by the 8-byte XxHash3
/// (System.IO.Hashing) of its bytes (a CRC step per 8 bytes would cost a long payload more than the hash does), so it
/// covers header and payload (the segment's full generation included, which a sealed word's bits 32..47 no longer
/// name). Unused and free: of two words, the block's offset XOR (full generation &lt;&lt; 40) and the commit's other
/// bits (tag, state, generation; kind 0), so they bind the word to its block and segment use but not to Uid, Epoch or
/// Shape, which an interrupted allocation may have overwritten. A CRC detects every error confined to 32 consecutive
/// bits of what it covers (a flipped bit, a damaged byte) for certain — the header words, and the payload's bytes up
/// to 64 — and other damage, as a 32-bit hash does, but for one pattern in 2^32 (so does a longer payload, through its
/// XxHash3). Formats 3 to 10 used the low 32 bits of XxHash3: two calls per sealed block, about three times the cost
/// of the CRC for a header and a 16-byte payload (a long payload's XxHash3 is paid either way).</para>
/// <para>Sealing (format 6). A <see cref="BufferedDurableHeap"/> seals every block of version V in V's cycle, after
/// V's quiescent cut, in the same pass that writes the version back: seals and payloads reach the file under one
/// fence, and only then is V's frontier persisted. Every block a frontier covers is therefore sealed and whole. A crash
/// inside that fence can leave a durable seal over a payload (or header words) that is not: such a block belongs to
/// V = frontier + 1, the one version whose cycle can be in flight (cycles run one at a time, each persisting its
/// frontier before the next seals anything). Recovery takes a sealed block whose check fails for a torn write — freed
/// — only if its Epoch word holds the block's empty mark (format 7), or both its version tag equals V's low 16 bits
/// and its Epoch word holds V; otherwise it is damage. The empty mark is in the file before a block is handed out:
/// formatting writes it, every free writes it next to its free word and the free's own write-back makes both durable
/// before the block is reused (recovery's frees, a large block's), and recovery rewrites every free or unused block whose
/// Epoch word holds anything else (an interrupted allocation's). A buffered heap's sweep (format 10) makes its frees
/// durable in the sweep log instead, before it hands the blocks out: an entry holds the block's commit word and the low
/// 16 bits of its Epoch word as the sweep found them, so recovery frees a listed block whose commit word is still the
/// logged one, and takes a listed block sealed in V whose check fails for a torn write when its Epoch word holds V or
/// the logged low bits (see <see cref="SweepLog"/>, which also says how long an entry is kept). So a torn seal of V holds V or the mark there; a crash
/// can also leave a free's mark durable without its free word, over a block sealed in a durable version, which the
/// free was making garbage (its replacement or deletion is durable): freed too. A damaged durable block of version
/// v ≤ frontier holds v and v's tag: damage is taken for a torn write only if it rewrites the Epoch word into exactly
/// the empty mark of that offset (a 64-bit value no version takes), or into V while the block's tag equals V's (a one
/// in 65,536 coincidence of versions) or is rewritten to it. A zeroed Epoch word, the usual shape of lost bytes, never
/// passes (in format 6 the empty mark was 0, and damage zeroing only the Epoch word of one live block in 65,536 was
/// freed silently). <see cref="DurabilityMode.Strict"/> operations write their payloads back and fence before their
/// version's cut, so their seals follow what they cover.</para>
/// <para>Every state is checked, so no zero or stale word stands for "nothing here". Formatting a segment zeroes it
/// and writes an unused commit word of the new generation (and the empty mark in the Epoch word) into every block,
/// durably, before its descriptor; a large block writes its header as unused of the new generation, durably, before
/// its descriptors. So after a crash every
/// commit word of a segment in use is one whole checked word of this segment's generation — unused, allocated, sealed
/// or free — and anything else (zero, another tag, an unknown state, another generation, an unused or free word whose
/// check fails) is damage, and so is a sealed block whose check fails. Likewise every descriptor below SegmentCount is
/// a checked word (creation and growth write free descriptors of generation 0 before the heap size covers them), so
/// an all-zero descriptor is damage, never "free". A segment recovery found empty (or an orphan continuation) keeps its
/// durable descriptor until it is reused; before anything is written into it for the new use, that descriptor is
/// rewritten as free, durably, so the new use's words never lie under a descriptor that still claims the segment.</para>
/// <para>Store order. Allocation writes Uid, Epoch, Shape with plain stores and then Commit with a release store;
/// Free replaces Commit with a single store of the free word. Neither writes back nor fences (as in Ralloc): the
/// caller persists the block when its protocol says so (<see cref="PersistentHeap.Persist(PayloadRef)"/>, or part 2's
/// per-version write-back). Because a cache may write back any subset of dirty words, a header is accepted at
/// recovery only if Commit's check equals the check of Uid, Epoch, Shape, the block's offset, the segment's full
/// generation, kind and state; a torn header (any subset of the four stores durable) fails the check (up to a
/// 2^-32 collision) if its Commit store is durable, and leaves the earlier unused or free word, which passes its own
/// check, if not: either way the block is free.</para>
/// <para>Segment descriptors are rewritten only on slow paths and always persisted (written back and fenced) before a
/// block of the segment is handed out, so a durable block header never refers to a descriptor that is not durable.
/// A new generation invalidates every header left in the segment from an earlier use. A large block writes its
/// continuation descriptors before its start descriptor and persists them with one fence; a continuation not covered
/// by a valid start is free. Freeing a large block rewrites its descriptors as free and persists them. A checked
/// descriptor no store of this format writes (a small class or a span out of range, an unknown role) is damage.</para>
/// <para>Saved state (fast reopen). At a clean shutdown of a <see cref="BufferedDurableHeap"/> whose garbage has all
/// been reclaimed, the allocator writes, into a run of free segments (descriptor role free, so a full scan never looks
/// at them), the words [StateMagic, SegmentCount, NextUid, EpochClock, DurableFrontier, TableHash, BitmapWords,
/// LogEnd0, LogEnd1, bitmap...]: where each half of the sweep log's batches end (0 for a raw heap), then one bit per
/// block of every small-block segment (in table order, ceil(blocks/64) words each), set when the block is allocated.
/// It persists them, then the three superblock words, then (HeapFile.Dispose) the clean flag. The next open trusts
/// the bitmap only if the clean flag was set and the hash, segment count and table hash match; once it has checked
/// the sweep log against the saved ends (whatever the clean flag: no open got past that check since the state was
/// saved, so the log is as it was), and before any other write, it clears word 80 durably, so a crash after a fast
/// reopen always rescans. A block the saved state counts free may be free in the sweep log only (format 10): a fast
/// reopen goes on with the log as it was, so a crash after it still finds those frees (a damaged log is salvaged by
/// writing those blocks free instead, and begins anew).</para>
/// <para>Creation writes and persists every superblock word except Magic, then writes and persists Magic: a file
/// whose creation was interrupted is rejected as "not a heap file" and is never silently reformatted.</para>
/// <para>Version space. Sealed words hold 42 bits, so a buffered heap's versions end at 2^42 − 1; it writes in
/// versions up to <see cref="LastWritableVersion"/> and keeps the last <see cref="VersionHeadroom"/> for opens (each
/// open begins one), so a heap that used its versions up still opens, read-only in effect.</para>
/// <para>Limits. The checks detect a word or block that no sequence of failure-atomic stores of this format leaves:
/// zeroed or truncated ranges, flipped bits, words from another offset or another use of the segment. They cannot
/// detect a lost write — a stale but internally valid older copy of a page or of the whole file (a disk or a cache
/// that dropped a write, a restored backup): an old descriptor, commit word or sealed block is exactly what the file
/// held earlier and passes every check. Detecting that needs a log or a version counter stored apart from the data.
/// Nor do they cover the payload of a block that is allocated but not sealed (a crash may leave it partial; part 2's
/// epoch tags decide), the bytes of a free segment, or deliberate forgery (they are non-cryptographic).</para>
/// </remarks>
internal static class HeapLayout
{
    internal const ulong Magic = 0x5041_4548_5356_5045UL;
    internal const long FormatVersion = 11;
    internal const int SuperblockSize = 4096;
    internal const int SegmentSize = 1 << SegmentShift;

    /// <summary>log2 of <see cref="SegmentSize"/>.</summary>
    internal const int SegmentShift = 16;
    internal const int RootSlotCount = 16;

    internal const int MagicOffset = 0;
    internal const int FormatVersionOffset = 8;
    internal const int HeapSizeOffset = 16;
    internal const int SegmentSizeOffset = 24;
    internal const int MaxSegmentsOffset = 32;
    internal const int DataStartOffset = 40;
    internal const int GeometryCheckOffset = 48;
    internal const int CleanShutdownOffset = 56;
    internal const int EpochClockOffset = 64;
    internal const int DurableFrontierOffset = 72;
    internal const int SavedStateOffset = 80;
    internal const int SavedStateWordsOffset = 88;
    internal const int SavedStateCheckOffset = 96;
    internal const int HeapKindOffset = 104;

    /// <summary>The version through which every block is durably sealed (a sealed word; advisory: absent, 0, in files written before it existed).</summary>
    internal const int SealedFrontierOffset = 112;

    /// <summary>The last version a salvage kept payloads of (a sealed word; 0 when the file was never salvaged, also in files written before it existed).</summary>
    internal const int SalvagedThroughOffset = 120;
    internal const int RootsOffset = 128;

    /// <summary>The sweep log's epoch (format 10; a sealed word): every batch's check is seeded with it, so raising it
    /// (durably, once recovery has written the frees the log held) empties the log at once.</summary>
    internal const int SweepLogEpochOffset = 256;

    /// <summary>The first of the sweep log's two mark records (see <see cref="SweepLog.WriteBackMark"/>); the second follows it by <see cref="SweepLogMarkBytes"/>.</summary>
    internal const int SweepLogMarksOffset = 320;

    /// <summary>The space of one mark record of the sweep log (a cache line; 6 words used).</summary>
    internal const int SweepLogMarkBytes = 64;

    /// <summary>Bits of a sealed word that carry the value; the 22 bits above carry its check.</summary>
    internal const int SealedValueBits = 42;
    internal const ulong SealedValueMask = (1UL << SealedValueBits) - 1;

    /// <summary>
    /// The versions kept for opens once a buffered heap's version space is used up: every open begins a version, so
    /// the last 2^20 values a sealed clock word takes are never written in. Without them a heap whose clock reached
    /// 2^42 − 1 could never be opened again (each open needs the next version), and its data was out of reach.
    /// </summary>
    internal const long VersionHeadroom = 1L << 20;

    /// <summary>
    /// The last version a buffered heap's operations may write in: 2^42 − 1 − <see cref="VersionHeadroom"/> (at one
    /// version per default 20 ms period, about 2,800 years). Past it no operation begins and no transition starts: what
    /// was written stays durable and readable (reopens draw on the headroom); to write again, copy it into a new heap.
    /// </summary>
    internal const long LastWritableVersion = (long)SealedValueMask - VersionHeadroom;

    /// <summary>Heap kinds recorded in <see cref="HeapKindOffset"/> (sealed): 0 until a heap first opens the file.</summary>
    internal const long KindUnclaimed = 0;
    internal const long KindRaw = 1;
    internal const long KindBufferedDurable = 2;

    /// <summary>
    /// Marks a saved allocator state. Changed when the free blocks a saved state may describe changed meaning, so that
    /// the first open by a newer build rescans instead of trusting an older build's state: "OPENSTT2" since torn
    /// allocations are freed durably at recovery (a state saved by an older build may cover torn headers left as they were);
    /// "OPENSTT3" since the state also holds where each half of the sweep log ends (words 7 and 8; 0 for a heap without a
    /// log), so that damage to a half's last batches is told from their end.
    /// </summary>
    internal const ulong SavedStateMagic = 0x3354_5453_4E45_504FUL;
    internal const int SavedStateHeaderWords = 9;

    internal const int HeaderSize = 32;
    internal const int UidOffset = 0;
    internal const int EpochOffset = 8;
    internal const int ShapeOffset = 16;
    internal const int CommitOffset = 24;

    internal const ulong CommitTag = 0xB7UL << 56;
    internal const ulong StateAllocated = 1;
    internal const ulong StateFree = 2;
    internal const ulong StateSealed = 4;
    internal const ulong StateUnused = 8;

    // Bit 3 of every role is set (format 5): the all-zero word is no descriptor, whatever its slot's check.
    internal const ulong RoleFree = 8;
    internal const ulong RoleSmall = 9;
    internal const ulong RoleLargeStart = 10;
    internal const ulong RoleLargeContinuation = 11;

    internal static long TableBytes(long maxSegments) => RoundUp(maxSegments * sizeof(long), SuperblockSize);

    /// <summary>Where the sweep log of a heap of <paramref name="maxSegments"/> starts: right after the segment table (format 10).</summary>
    internal static long SweepLogStart(long maxSegments) => SuperblockSize + TableBytes(maxSegments);

    /// <summary>The smallest and the largest sweep log (format 10): a multiple of <see cref="SweepLogGranule"/> between them.</summary>
    internal const long MinSweepLogBytes = 64 * 1024;
    internal const long MaxSweepLogBytes = 8 * 1024 * 1024;

    /// <summary>A sweep log is two halves of whole pages.</summary>
    internal const long SweepLogGranule = 2 * SuperblockSize;

    /// <summary>
    /// The bytes of the sweep log (format 10) a heap of <paramref name="size"/> bytes growing to
    /// <paramref name="maxSegments"/> gets at creation: 256 bytes per segment (16 entries), at most an eighth of the
    /// size, from 64 KiB to 8 MiB, in two halves of whole pages (see <see cref="SweepLog"/>). The file records it:
    /// segment 0 starts right after it (<see cref="DataStartOffset"/>).
    /// </summary>
    internal static long SweepLogBytes(long maxSegments, long size) =>
        Math.Clamp(Math.Min(RoundUp(maxSegments * 256, SweepLogGranule), size / 8 / SweepLogGranule * SweepLogGranule), MinSweepLogBytes, MaxSweepLogBytes);

    /// <summary>Whether a file's data start leaves a sweep log this format writes after the table of <paramref name="maxSegments"/>.</summary>
    internal static bool IsValidDataStart(long dataStart, long maxSegments)
    {
        long log = dataStart - SweepLogStart(maxSegments);
        return log is >= MinSweepLogBytes and <= MaxSweepLogBytes && log % SweepLogGranule == 0;
    }

    /// <summary>Where segment 0 of a heap of <paramref name="size"/> bytes growing to <paramref name="maxSegments"/> starts (after its sweep log).</summary>
    internal static long DataStart(long maxSegments, long size) => SweepLogStart(maxSegments) + SweepLogBytes(maxSegments, size);

    /// <summary>The largest data start of a heap of <paramref name="maxSegments"/> (its largest sweep log): a bound for sizing.</summary>
    internal static long MaxDataStart(long maxSegments) => SweepLogStart(maxSegments) + Math.Clamp(RoundUp(maxSegments * 256, SweepLogGranule), MinSweepLogBytes, MaxSweepLogBytes);

    internal static long RoundUp(long value, long multiple) => (value + multiple - 1) / multiple * multiple;

    internal static ulong GeometryCheck(ulong magic, ulong version, ulong segmentSize, ulong maxSegments, ulong dataStart)
    {
        // XxHash3 (System.IO.Hashing) of the five immutable geometry words.
        Span<ulong> words = stackalloc ulong[] { magic, version, segmentSize, maxSegments, dataStart };
        return System.IO.Hashing.XxHash3.HashToUInt64(System.Runtime.InteropServices.MemoryMarshal.AsBytes(words));
    }

    /// <summary>
    /// Seals a mutable superblock word (size, clock, frontier, clean flag, heap kind): the value in the low 42 bits, the
    /// low 22 bits of a CRC-32 (System.IO.Hashing) of the value and the word's offset above it. One aligned 8-byte store,
    /// so a crash leaves the old or the new sealed word, never a mix, and any other content — a flipped bit — fails
    /// <see cref="TryUnseal"/>. (Every single-bit flip is caught: a test checks all 64 positions at every sealed offset.)
    /// </summary>
    internal static ulong Seal(long value, int offset)
    {
        if ((ulong)value > SealedValueMask)
        {
            ThrowHelper.ThrowArgumentOutOfRange(nameof(value), $"{value} does not fit a sealed superblock word (0 to 2^{SealedValueBits} - 1).");
        }

        return (ulong)value | ((ulong)SealCheck((ulong)value, offset) << SealedValueBits);
    }

    /// <summary>Whether <paramref name="word"/> is a sealed word of <paramref name="offset"/>; its value when it is.</summary>
    internal static bool TryUnseal(ulong word, int offset, out long value)
    {
        value = (long)(word & SealedValueMask);
        return word >> SealedValueBits == SealCheck(word & SealedValueMask, offset) || HeapFileTestHooks.IgnoreSeals;
    }

    private static uint SealCheck(ulong value, int offset)
    {
        Span<byte> bytes = stackalloc byte[16];
        System.Buffers.Binary.BinaryPrimitives.WriteUInt64LittleEndian(bytes, value);
        System.Buffers.Binary.BinaryPrimitives.WriteUInt64LittleEndian(bytes[8..], (ulong)offset ^ Magic);
        return System.IO.Hashing.Crc32.HashToUInt32(bytes) & ((1u << (64 - SealedValueBits)) - 1);
    }

    /// <summary>XxHash3 (System.IO.Hashing) of <paramref name="words"/>, seeded (for the saved state and the segment table).</summary>
    /// <remarks>Past 2^28 words (a saved state of a heap near its largest size, or a damaged count within the heap) a
    /// span cannot hold the bytes: hashed in chunks, which gives the one-shot hash of the whole (XxHash3 streaming).</remarks>
    internal static unsafe ulong Hash(ulong* words, long count, ulong seed)
    {
        const long ChunkWords = 1L << 24;
        if (count <= ChunkWords)
        {
            return System.IO.Hashing.XxHash3.HashToUInt64(new ReadOnlySpan<byte>(words, (int)(count * sizeof(ulong))), (long)seed);
        }

        var hash = new System.IO.Hashing.XxHash3((long)seed);
        for (long done = 0; done < count; done += ChunkWords)
        {
            hash.Append(new ReadOnlySpan<byte>(words + done, (int)(Math.Min(ChunkWords, count - done) * sizeof(ulong))));
        }

        return hash.GetCurrentHashAsUInt64();
    }

    // ---- segment descriptors ----

    internal const uint GenerationMask = 0xFF_FFFF;
    private const ulong DescriptorCheckMask = (0xFFUL << 24) | (0xFUL << 36);

    /// <summary>XORed with a segment's index in its descriptor's check, so that index 0 is not the zero word.</summary>
    private const ulong DescriptorSlotSeed = 0x5345_4753_4C4F_5453UL;

    /// <summary>The descriptor of segment <paramref name="segment"/> given back as free: a new generation, which invalidates every header of its last use.</summary>
    internal static ulong FreedDescriptor(ulong previous, long segment) => Descriptor(NextGeneration(previous), RoleFree, 0, segment);

    /// <summary>The descriptor written for segment <paramref name="segment"/> when the heap is created or grows: free, generation 0 (never 0 itself).</summary>
    internal static ulong InitialDescriptor(long segment) => Descriptor(0, RoleFree, 0, segment);

    /// <summary>The generation the next rewrite of <paramref name="descriptor"/> gets (mod 2^24): what formatting writes into the segment's commit words before the descriptor.</summary>
    internal static uint NextGeneration(ulong descriptor) => (DescriptorGeneration(descriptor) + 1) & GenerationMask;

    /// <summary>The checked descriptor of segment <paramref name="segment"/> (its slot in the table): valid in that slot only.</summary>
    internal static ulong Descriptor(uint generation, ulong role, ulong payload, long segment)
    {
        ulong content = (generation & GenerationMask) | (role << 32) | (payload << 40);
        return content | DescriptorCheck(content, segment);
    }

    /// <summary>
    /// Whether <paramref name="descriptor"/> is a checked descriptor of segment <paramref name="segment"/>. A
    /// descriptor is one failure-atomic word, so after a crash it is an old or a new valid word: a mismatch is damage,
    /// never a torn write. The check covers the slot: a valid descriptor of another segment, copied or swapped into
    /// this slot, fails. The all-zero word is not valid in any slot (every role has bit 35 set): a zeroed descriptor
    /// is damage, never a free segment.
    /// </summary>
    internal static bool IsValidDescriptor(ulong descriptor, long segment) =>
        ((descriptor & (1UL << 35)) != 0 && (descriptor & DescriptorCheckMask) == DescriptorCheck(descriptor & ~DescriptorCheckMask, segment)) || HeapFileTestHooks.IgnoreSeals;

    /// <summary>
    /// The low 12 bits of CRC-32 (System.IO.Hashing) of the content and the slot, in bits 24..31 and 36..39. Affine in
    /// the content: a single flipped bit changes the check by a fixed non-zero pattern, whatever the slot.
    /// </summary>
    private static ulong DescriptorCheck(ulong content, long segment)
    {
        Span<byte> bytes = stackalloc byte[16];
        System.Buffers.Binary.BinaryPrimitives.WriteUInt64LittleEndian(bytes, content);
        System.Buffers.Binary.BinaryPrimitives.WriteUInt64LittleEndian(bytes[8..], (ulong)segment ^ DescriptorSlotSeed);
        uint crc = System.IO.Hashing.Crc32.HashToUInt32(bytes);
        return ((ulong)(crc & 0xFF) << 24) | ((ulong)((crc >> 8) & 0xF) << 36);
    }

    internal static uint DescriptorGeneration(ulong descriptor) => (uint)descriptor & GenerationMask;

    internal static ulong DescriptorRole(ulong descriptor) => (descriptor >> 32) & 0xF;

    internal static long DescriptorPayload(ulong descriptor) => (long)(descriptor >> 40);

    // ---- block headers ----

    internal static ulong Shape(int size, int typeId) => (uint)size | ((ulong)(uint)typeId << 32);

    internal static int ShapeSize(ulong shape) => (int)(uint)shape;

    internal static int ShapeTypeId(ulong shape) => (int)(shape >> 32);

    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    internal static ulong AllocatedCommit(ulong uid, ulong epoch, ulong shape, long offset, uint generation, PayloadKind kind)
    {
        ulong meta = Meta(StateAllocated, kind, generation);
        return meta | HeaderCheck(uid, epoch, shape, offset, generation, meta);
    }

    /// <summary>
    /// The sealed commit of a complete block: its check covers the header, <paramref name="payload"/>, the block's
    /// offset and the segment's full generation; bits 32..47 carry the version tag, the low 16 bits of <paramref name="epoch"/>.
    /// </summary>
    internal static ulong SealedCommit(ulong uid, ulong epoch, ulong shape, long offset, uint generation, PayloadKind kind, ReadOnlySpan<byte> payload)
    {
        ulong meta = Meta(StateSealed, kind, (ushort)epoch);
        return meta | SealCheck(uid, epoch, shape, offset, generation, meta, payload);
    }

    /// <summary>A sealed commit word's version tag: the low 16 bits of the version it was sealed in.</summary>
    internal static ushort VersionTag(ulong commit) => (ushort)(commit >> 32);

    /// <summary>
    /// The Epoch word of the block at <paramref name="offset"/> while it holds no payload (format 7): formatting writes
    /// it, and so does every free, next to the free word. Bound to the offset, and never a version (its
    /// high bits are set; versions fit in a sealed word's 42 bits), so neither a zeroed word nor a version is taken for it.
    /// </summary>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    internal static ulong EmptyEpoch(long offset) => EmptyEpochSeed ^ (ulong)offset;

    private const ulong EmptyEpochSeed = 0xE9E7_0000_0000_0000UL;

    /// <summary>The free commit word of the block at <paramref name="offset"/> in a segment of <paramref name="generation"/> (checked: kind 0, check of offset, generation and state).</summary>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    internal static ulong FreeWord(long offset, uint generation) => EmptyWord(StateFree, offset, generation);

    /// <summary>The commit word formatting writes into the block at <paramref name="offset"/> of a segment of <paramref name="generation"/>: never allocated since.</summary>
    internal static ulong UnusedWord(long offset, uint generation) => EmptyWord(StateUnused, offset, generation);

    /// <summary>Whether a commit word that is not sealed names the segment's generation (low 16 bits).</summary>
    internal static bool SameGeneration(ulong commit, uint generation) => (ushort)(commit >> 32) == (ushort)generation;

    internal static ulong CommitState(ulong commit) => (commit >> 52) & 0xF;

    /// <summary>Whether a commit word holds a block in use (allocated or sealed).</summary>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    internal static bool InUse(ulong commit) =>
        (commit & (0xFFUL << 56)) == CommitTag && (CommitState(commit) == StateAllocated || CommitState(commit) == StateSealed);

    internal static PayloadKind CommitKind(ulong commit) => (PayloadKind)((commit >> 48) & 0xF);

    /// <summary>Whether the four header words form one complete allocation of the block at <paramref name="offset"/> in a segment of <paramref name="generation"/> (header check only; a sealed block's structure only).</summary>
    internal static bool IsValidAllocated(ulong uid, ulong epoch, ulong shape, ulong commit, long offset, uint generation)
    {
        if (!InUse(commit) || CommitKind(commit) is < PayloadKind.Alloc or > PayloadKind.Delete)
        {
            return false;
        }

        return CommitState(commit) == StateSealed
            ? VersionTag(commit) == (ushort)epoch
            : SameGeneration(commit, generation) && (uint)commit == HeaderCheck(uid, epoch, shape, offset, generation, commit & ~0xFFFF_FFFFUL);
    }

    /// <summary>
    /// Classifies the block at <paramref name="block"/> (file offset <paramref name="offset"/>) of a segment in use of
    /// <paramref name="generation"/>, for recovery: reads the commit word first and hashes a payload only after its size
    /// was checked against <paramref name="maxPayload"/>.
    /// </summary>
    /// <param name="block">The block's first byte.</param>
    /// <param name="offset">The block's file offset.</param>
    /// <param name="generation">The segment's full generation.</param>
    /// <param name="maxPayload">The largest payload the block holds.</param>
    /// <param name="header">The header, for an allocated or sealed block.</param>
    /// <param name="inFlightVersion">The version whose cycle a crash may have interrupted (a buffered heap's frontier + 1),
    /// whose blocks may be sealed over bytes that are not durable; 0 when no block can be (a raw heap).</param>
    /// <param name="faults">The broken controls of the in-flight rule (tests only).</param>
    internal static unsafe BlockState Classify(byte* block, long offset, uint generation, long maxPayload, out PayloadHeader header, long inFlightVersion = 0, HeapFaults faults = HeapFaults.None)
    {
        ulong* h = (ulong*)block;
        ulong uid = h[0], epoch = h[1], shape = h[2], commit = h[3];
        header = default;
        ulong state = CommitState(commit);
        if ((commit & (0xFFUL << 56)) != CommitTag || (state != StateSealed && !SameGeneration(commit, generation))
            || (state != StateAllocated && state != StateFree && state != StateSealed && state != StateUnused))
        {
            // Commit words are written whole, and formatting writes a checked one into every block before the
            // descriptor: no crash leaves this (a zeroed word included). (A sealed word names its version, not the
            // generation: its check covers the full generation.)
            return HeapFileTestHooks.IgnoreSeals ? BlockState.Free : BlockState.Damaged;
        }

        if (state is StateFree or StateUnused)
        {
            // Written whole (formatting, a free, recovery): the check covers offset, generation and state, so a zeroed,
            // moved or state-flipped word fails. An allocation overwrites Uid, Epoch and Shape before the commit word,
            // which this check does not cover: an interrupted allocation leaves a valid free or unused word.
            if (CommitKind(commit) != 0 || commit != EmptyWord(state, offset, generation))
            {
                return HeapFileTestHooks.IgnoreSeals ? BlockState.Free : BlockState.Damaged;
            }

            return state == StateFree ? BlockState.Free : BlockState.Unused;
        }

        PayloadKind kind = CommitKind(commit);
        // A size word of 2^31 or more is no payload this format writes (PersistentHeap.MaxPayloadSize < int.MaxValue): read
        // as an int it is negative, which no span takes (a large block's maxPayload reaches 2^40).
        bool shapeFits = kind is >= PayloadKind.Alloc and <= PayloadKind.Delete && ShapeSize(shape) >= 0 && ShapeSize(shape) <= maxPayload;
        if (state == StateAllocated)
        {
            // Allocated, not sealed: a crash may leave any subset of the header's stores durable, so a failed check
            // is a torn allocation (free), not damage.
            if ((uint)commit != HeaderCheck(uid, epoch, shape, offset, generation, commit & ~0xFFFF_FFFFUL))
            {
                // Unless its check is the seal's of the same words: a sealed block whose state bits were damaged to
                // "allocated" (two bits apart), which no crash leaves (an allocation writes the header's check).
                ulong sealedMeta = (commit & ~0xFFFF_FFFFUL & ~(0xFUL << 52)) | (StateSealed << 52);
                if (shapeFits && (uint)commit == SealCheck(uid, epoch, shape, offset, generation, sealedMeta, new ReadOnlySpan<byte>(block + HeaderSize, ShapeSize(shape))))
                {
                    return HeapFileTestHooks.IgnoreSeals ? BlockState.Torn : BlockState.Damaged;
                }

                return BlockState.Torn;
            }

            if (!shapeFits)
            {
                return HeapFileTestHooks.IgnoreSeals ? BlockState.Torn : BlockState.Damaged;
            }

            header = new PayloadHeader((long)uid, (long)epoch, kind, ShapeSize(shape), ShapeTypeId(shape));
            return BlockState.Allocated;
        }

        if (shapeFits && (uint)commit == SealCheck(uid, epoch, shape, offset, generation, commit & ~0xFFFF_FFFFUL, new ReadOnlySpan<byte>(block + HeaderSize, ShapeSize(shape))))
        {
            header = new PayloadHeader((long)uid, (long)epoch, kind, ShapeSize(shape), ShapeTypeId(shape));
            return BlockState.Sealed;
        }

        if (HeapFileTestHooks.IgnoreSeals)
        {
            if (shapeFits)
            {
                header = new PayloadHeader((long)uid, (long)epoch, kind, ShapeSize(shape), ShapeTypeId(shape));
                return BlockState.Sealed;
            }

            return BlockState.Free;
        }

        // Sealed in the cycle a crash interrupted, in the pass that writes the version back: the seal reached the file,
        // some of what it covers did not (the version is beyond the frontier, dropped whole). Or freed, and the free's
        // empty mark reached the file without its free word.
        return IsTornWrite(commit, epoch, offset, inFlightVersion, faults) ? BlockState.Torn : BlockState.Damaged;
    }

    /// <summary>
    /// Whether a sealed block whose check fails is a torn write (see the remarks on sealing) of a buffered heap
    /// (<paramref name="inFlightVersion"/> &gt; 0): its Epoch word holds the block's empty mark — a free interrupted
    /// before its free word reached the file, or a seal of the version in flight over an Epoch word that did not — or
    /// its version tag and its Epoch word both name the version in flight. A block sealed in a durable version v holds v
    /// in both, so damage there is taken for a torn write only if it rewrites the Epoch word into one of those exact
    /// values (a zeroed word is neither, nor is v ± a bit) and, for the version in flight, the tags agree.
    /// </summary>
    private static bool IsTornWrite(ulong commit, ulong epoch, long offset, long inFlightVersion, HeapFaults faults)
    {
        if (inFlightVersion <= 0)
        {
            return false;
        }

        if (epoch == EmptyEpoch(offset) && (faults & HeapFaults.MarkedFreesAreDamage) == 0)
        {
            return true;
        }

        bool tagMatches = VersionTag(commit) == (ushort)inFlightVersion || (faults & HeapFaults.TornSealsByEpochWordOnly) != 0;
        bool epochMatches = epoch == (ulong)inFlightVersion || (faults & HeapFaults.TornSealsByVersionTagOnly) != 0;
        return tagMatches && epochMatches;
    }

    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    private static ulong Meta(ulong state, PayloadKind kind, uint generation) =>
        CommitTag | (state << 52) | ((ulong)kind << 48) | ((ulong)(ushort)generation << 32);

    /// <summary>An unused or free commit word: tag, state, generation (low 16 bits), kind 0, and the CRC-32C of the block's offset with the full generation and those bits.</summary>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    private static ulong EmptyWord(ulong state, long offset, uint generation)
    {
        ulong meta = Meta(state, 0, generation);
        return meta | ~BitOperations.Crc32C(BitOperations.Crc32C(Crc32CInitial, (ulong)offset ^ ((ulong)generation << 40)), meta);
    }

    /// <summary>The longest payload whose bytes a seal's CRC-32C takes one by one; a longer one's XxHash3 stands for them (see the remarks on checks).</summary>
    internal const int RawCheckedPayload = 64;

    /// <summary>CRC-32C's initial register; the check is the final register inverted.</summary>
    internal const uint Crc32CInitial = 0xFFFF_FFFFu;

    /// <summary>The allocated check: CRC-32C of the header words, the block's offset with the segment's full generation, and the commit's other bits.</summary>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    private static uint HeaderCheck(ulong uid, ulong epoch, ulong shape, long offset, uint generation, ulong meta) =>
        ~HeaderCrc(uid, epoch, shape, offset, generation, meta);

    /// <summary>The CRC-32C register after the five header words, not yet inverted (the allocated and the sealed checks go on from it).</summary>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    private static uint HeaderCrc(ulong uid, ulong epoch, ulong shape, long offset, uint generation, ulong meta)
    {
        uint crc = BitOperations.Crc32C(Crc32CInitial, uid);
        crc = BitOperations.Crc32C(crc, epoch);
        crc = BitOperations.Crc32C(crc, shape);
        crc = BitOperations.Crc32C(crc, (ulong)offset ^ ((ulong)generation << 40));
        return BitOperations.Crc32C(crc, meta);
    }

    /// <summary>The sealed check: CRC-32C of the header words, then of the payload's bytes (or of their XxHash3, past <see cref="RawCheckedPayload"/> bytes).</summary>
    private static uint SealCheck(ulong uid, ulong epoch, ulong shape, long offset, uint generation, ulong meta, ReadOnlySpan<byte> payload)
    {
        uint crc = HeaderCrc(uid, epoch, shape, offset, generation, meta);
        return ~(payload.Length > RawCheckedPayload
            ? BitOperations.Crc32C(crc, System.IO.Hashing.XxHash3.HashToUInt64(payload))
            : Crc32CBytes(crc, payload));
    }

    /// <summary>Continues a CRC-32C register over <paramref name="bytes"/>: 8 bytes at a time (little-endian), then 4, 2 and 1.</summary>
    [MethodImpl(MethodImplOptions.AggressiveInlining)]
    internal static uint Crc32CBytes(uint crc, ReadOnlySpan<byte> bytes)
    {
        int i = 0;
        for (; i + sizeof(ulong) <= bytes.Length; i += sizeof(ulong))
        {
            crc = BitOperations.Crc32C(crc, BinaryPrimitives.ReadUInt64LittleEndian(bytes[i..]));
        }

        if (i + sizeof(uint) <= bytes.Length)
        {
            crc = BitOperations.Crc32C(crc, BinaryPrimitives.ReadUInt32LittleEndian(bytes[i..]));
            i += sizeof(uint);
        }

        if (i + sizeof(ushort) <= bytes.Length)
        {
            crc = BitOperations.Crc32C(crc, BinaryPrimitives.ReadUInt16LittleEndian(bytes[i..]));
            i += sizeof(ushort);
        }

        if (i < bytes.Length)
        {
            crc = BitOperations.Crc32C(crc, bytes[i]);
        }

        return crc;
    }
}
