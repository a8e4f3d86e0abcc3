using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Runtime.InteropServices;
using System.Threading;

namespace Epvs.Persistence;

/// <summary>
/// The sweep log (format 10): where a <see cref="BufferedDurableHeap"/>'s sweeps make their frees durable, in place of
/// the freed blocks' headers. A sweep used to write back the header of every block it freed and fence before handing
/// the blocks out: through the page cache that wrote each freed page whole (about 48 bytes per 48-byte block), and the
/// version that reused the block wrote the same page again. A sweep now appends one entry of 16 bytes per block to the
/// log, writes back those bytes and fences: a block is durably free when its entry is durable, whatever its header in
/// the file says, and its page is written once, by the version that reuses it.
/// </summary>
/// <remarks>
/// <para>Layout. The log lies between the segment table and segment 0 (<see cref="HeapLayout.SweepLogStart"/> to
/// <see cref="HeapFile.DataStart"/>; its size chosen at creation, <see cref="HeapLayout.SweepLogBytes"/>), in two halves. A half starts with its lap (a sealed word of its offset);
/// batches follow it back to back: a batch header word (tag 0x5B in bits 56..63, the low 24 bits of the half's lap in
/// bits 32..55, the count of entries in bits 0..31), the entries, and a check word (XxHash3 of the header and the
/// entries, seeded with the superblock's sweep-log epoch, the half's lap and the batch's offset). An entry is two words:
/// the block's offset with the low 16 bits of its Epoch word at the sweep in bits 48..63, and its commit word at the
/// sweep. A batch is valid when its check holds for the current epoch and its half's lap: raising the epoch (durably,
/// once recovery has written the frees the log held) empties the whole log, and a new lap empties a half.</para>
/// <para>What an entry means at recovery. The block was free when the sweep logged it, and its file image then was its
/// last durable content: its commit word was the logged one, or the block's free was durable already. Afterwards the
/// block is reused: a version writes a header and a payload over it, which reach the file in any order and any subset
/// until that version's cycle has written it back. So a listed block whose commit word still equals the logged one is
/// free, whatever else reached the file (the old payload's garbage, or a reuse torn before its header landed); and one
/// whose commit word is a seal of the version in flight that fails its check is a torn reuse, whether its Epoch word
/// holds that version or still the logged one's low bits (format 9 had the block's empty mark there, written with the
/// free). Anything else is classified as without the log: a reuse the frontier covers is live (its commit word is no
/// logged one, up to the chance that a 64-bit commit word repeats at an offset), and damage is still reported.</para>
/// <para>Retention. An entry must stay valid while its block's file image can still be the logged one: until a version
/// the frontier covers has sealed the block's reuse. When the log runs out of room in one half it turns to the other:
/// first it writes back, from the working image, the header of every block listed there that is not sealed in a
/// durable version (free in a pool still, or reused by a version in flight, whose header then reaches the file early
/// as a write-back of a Strict operation's or of a merged run's does), fences, and only then gives the half its new lap,
/// which retires its entries. A fast reopen, which trusts the frees of the saved state, goes on with the log as the
/// last session left it; a recovery scan writes every free it takes from the log into the block's header before it
/// raises the epoch, which empties the log.</para>
/// <para>Damage. A batch that fails its check ends its half's scan: it is the last append, torn by a crash before its
/// fence (its blocks were never handed out), unless a valid batch of the same lap follows it, which only damage leaves
/// (reported, before recovery writes anything; with <see cref="PersistentHeapOptions.SalvageDamagedBlocks"/> the damaged
/// batch, or a half whose lap word is damaged or behind a mark, is skipped instead: the frees it held are lost, its blocks are classified
/// as without the log, and the recovery report lists where). After a clean shutdown the saved state holds where each
/// half's batches end (<see cref="Ends"/>): damage to a half's last batches is then told from their end too, and a
/// salvage that takes the saved state writes free every block it counts free whose header is not, so that no frees the
/// damaged entries held are lost. After a crash, each cycle's mark tells it instead (<see cref="WriteBackMark"/>): a
/// half whose valid batches end short of where a mark of its lap and the current epoch says they reached is damaged,
/// and so is a lap word that holds a lower lap than such a mark names (a lost write of a turn's lap). Only damage to batches appended after the last mark that reached the file (the sweeps since the last advance that
/// completed: about one advance period's, or since the last explicit advance when the period is infinite) cannot be
/// told from a torn append: their blocks are then classified without the log (a reuse torn over one
/// reads as damage, an old copy of a payload whose newer copy was deleted since could come back). That, like a lost
/// write, is outside what the checks detect.</para>
/// <para>Threads. Appends and turns serialize on the log's lock, each on the sweeping thread, which writes back and
/// fences there; each then publishes the ends it made durable, which a cycle's mark reads without the log's lock. The
/// working image of a listed block is read without any lock at a turn: it may be in the middle of an allocation, and a
/// header written back then is any mix of old and new words, which the header checks cover.</para>
/// </remarks>
internal sealed unsafe class SweepLog
{
    private const ulong BatchTag = 0x5BUL << 56;
    private const ulong LapMask = 0xFF_FFFF;
    private const ulong OffsetMask = (1UL << 48) - 1;

    private readonly HeapFile _file;
    private readonly PersistenceDomain _domain;
    private readonly byte* _base;
    private readonly long _start;
    private readonly long _halfBytes;
    private readonly long _epoch;
    private readonly object _gate = new();

    /// <summary>Per half, the blocks its valid batches list (under <see cref="_gate"/>).</summary>
    private readonly List<long>[] _listed = [new List<long>(), new List<long>()];

    /// <summary>The sort's buffer at a turn (under <see cref="_gate"/>; as large as a half's list once one turned).</summary>
    private long[] _sortScratch = [];

    private int _half;
    private long _lap;
    private long _maxLap;
    private long _position;

    /// <summary>Where the other half's valid batches end (its entries are kept until the log turns back to it).</summary>
    private long _otherEnd;

    /// <summary>The other half's lap.</summary>
    private long _otherLap;

    /// <summary>
    /// Each half's lap and where its batches end, as far as they are durable: published after each of the log's fences
    /// (an append's, a turn's), so a mark never names a batch whose fence failed, and reads it without the log's lock.
    /// </summary>
    private FencedEnds _fenced;

    /// <summary>Serializes the marks (cycles run one at a time; this keeps the records' state consistent regardless).</summary>
    private readonly object _markGate = new();

    /// <summary>What the last mark recorded (under <see cref="_markGate"/>); null before the first.</summary>
    private FencedEnds? _marked;

    /// <summary>Which of the two mark records the next mark overwrites (under <see cref="_markGate"/>; the other holds the last one).</summary>
    private int _nextMark;

    private SweepLog(HeapFile file, long epoch, Contents contents)
    {
        _file = file;
        _domain = file.Domain;
        _base = file.Pointer;
        _start = HeapLayout.SweepLogStart(file.MaxSegments);
        _halfBytes = (file.DataStart - _start) / 2;
        _epoch = epoch;
        // Appends go on in the half of the higher lap (the last one turned to), after its last valid batch.
        _half = contents.Laps[1] > contents.Laps[0] ? 1 : 0;
        _lap = contents.Laps[_half];
        _maxLap = Math.Max(contents.Laps[0], contents.Laps[1]);
        _position = contents.Ends[_half];
        _otherEnd = contents.Ends[1 - _half];
        _otherLap = contents.Laps[1 - _half];
        _fenced = Fenced();
        _listed[0].AddRange(contents.Listed[0]);
        _listed[1].AddRange(contents.Listed[1]);
    }

    /// <summary>
    /// Where each half's valid batches end (file offsets), as <see cref="Read(HeapFile, bool)"/> would find them: saved
    /// with a clean shutdown's allocator state, so that the next open tells damage to the last batches of a half (which
    /// reads as the end of its batches) from their end.
    /// </summary>
    internal (long Half0, long Half1) Ends
    {
        get
        {
            using (InterruptShield.Hold(_gate))
            {
                return _half == 0 ? (_position, _otherEnd) : (_otherEnd, _position);
            }
        }
    }

    /// <summary>Times the log turned to its other half (tests and the benchmark).</summary>
    internal long Turns { get; private set; }

    /// <summary>Headers written back by turns: blocks still free, or reused by a version in flight, when their entries were retired.</summary>
    internal long HeadersWrittenBack { get; private set; }

    /// <summary>Entries in the log's valid batches (appended in this session or, after a fast reopen, in the last).</summary>
    internal long Listed
    {
        get
        {
            using (InterruptShield.Hold(_gate))
            {
                return _listed[0].Count + _listed[1].Count;
            }
        }
    }

    /// <summary>Entries appended since the heap opened.</summary>
    internal long EntriesAppended { get; private set; }

    /// <summary>Test hook: runs at the end of each turn (the new lap durable), under the log's lock.</summary>
    internal Action? AfterTurnForTesting { get; set; }

    /// <summary>Broken control: a turn writes its new lap word back without a fence of its own (the next batch's fences it).</summary>
    internal bool LapFencedWithNextBatchForTesting { get; set; }

    /// <summary>Broken control: a turn retires the other half's entries without writing back the headers of the blocks they list.</summary>
    internal bool RetireWithoutWritingBackForTesting { get; set; }

    /// <summary>
    /// At creation: the halves' laps (1 and 0) of the log in [<paramref name="start"/>, <paramref name="end"/>) and its
    /// first epoch, drawn at random below 2^31, in the image <paramref name="p"/> the caller persists. The rest of the
    /// log is left as it is: a heap created over the bytes of another (a domain used before) must not take that heap's
    /// batches for its own, and their checks were seeded with that heap's epochs.
    /// </summary>
    internal static void Format(byte* p, long start, long end)
    {
        long half = (end - start) / 2;
        *(ulong*)(p + start) = HeapLayout.Seal(1, (int)start);
        *(ulong*)(p + start + half) = HeapLayout.Seal(0, (int)(start + half));
        *(ulong*)(p + HeapLayout.SweepLogEpochOffset) = HeapLayout.Seal(System.Security.Cryptography.RandomNumberGenerator.GetInt32(int.MaxValue) + 1L, HeapLayout.SweepLogEpochOffset);
    }

    /// <summary>
    /// After a recovery scan has written every free it took from the log: raises the epoch durably (every batch written
    /// so far is void from here on) and opens the log, empty, for this session's appends. A lap word that is damaged
    /// (skipped by a salvage) is written anew once the epoch is raised: the half holds nothing any more.
    /// </summary>
    internal static SweepLog Begin(HeapFile file)
    {
        long epoch = file.SweepLogEpoch + 1;
        file.SweepLogEpoch = epoch;
        long start = HeapLayout.SweepLogStart(file.MaxSegments);
        long half = (file.DataStart - start) / 2;
        long[] laps = new long[2];
        bool[] intact = new bool[2];
        for (int h = 0; h < 2; h++)
        {
            intact[h] = HeapLayout.TryUnseal(*(ulong*)(file.Pointer + start + (h * half)), (int)(start + (h * half)), out laps[h]);
        }

        // After the epoch: a crash in between leaves the lap word damaged, so the next open refuses, or salvages again (a
        // half that holds nothing any more), rather than reading a half under a lap it may never have had.
        for (int h = 0; h < 2; h++)
        {
            if (!intact[h])
            {
                // Above the other half's lap, so that appends begin here; 1 and 0 (as Format writes them) if both are damaged.
                laps[h] = intact[1 - h] ? laps[1 - h] + 1 : 1 - h;
                long offset = start + (h * half);
                Volatile.Write(ref *(ulong*)(file.Pointer + offset), HeapLayout.Seal(laps[h], (int)offset));
                file.Domain.PersistOwned(offset, sizeof(ulong));
            }
        }

        return new SweepLog(file, epoch, new Contents(laps, [start + sizeof(ulong), start + half + sizeof(ulong)], [[], []], new LoggedFrees(), []));
    }

    /// <summary>
    /// After a fast reopen (which trusts the saved state's frees, some of them durable in the log only): goes on with
    /// the log as the last session left it, its entries kept until their halves turn.
    /// </summary>
    /// <param name="file">The heap file.</param>
    /// <param name="contents">The log as <see cref="Read(HeapFile, bool)"/> found it.</param>
    internal static SweepLog Resume(HeapFile file, Contents contents)
    {
        // A salvaged log is never resumed: the recovery wrote its frees into the blocks and begins a new log instead.
        Debug.Assert(contents.Damaged.Count == 0, "a damaged sweep log is resumed");
        return new(file, file.SweepLogEpoch, contents);
    }

    /// <summary>
    /// Appends an entry for each of <paramref name="offsets"/>, with its commit word and Epoch word before the sweep
    /// freed it, writes them back and fences: when it returns the blocks are durably free.
    /// </summary>
    internal void Append(ReadOnlySpan<long> offsets, ReadOnlySpan<ulong> commits, ReadOnlySpan<ulong> epochWords)
    {
        using (InterruptShield.Hold(_gate))
        {
            int done = 0;
            while (done < offsets.Length)
            {
                long fit = ((_start + ((_half + 1) * _halfBytes) - _position) / sizeof(ulong) - 2) / 2;
                if (fit <= 0)
                {
                    Turn();
                    continue;
                }

                int count = (int)Math.Min(fit, offsets.Length - done);
                ulong* batch = (ulong*)(_base + _position);
                batch[0] = BatchTag | (((ulong)_lap & LapMask) << 32) | (uint)count;
                for (int i = 0; i < count; i++)
                {
                    batch[1 + (2 * i)] = (ulong)offsets[done + i] | ((epochWords[done + i] & 0xFFFF) << 48);
                    batch[2 + (2 * i)] = commits[done + i];
                }

                long words = (2L * count) + 2;
                batch[words - 1] = Check(batch, words - 1, _epoch, _lap, _position);
                _domain.WriteBackOwned(_position, words * sizeof(ulong));
                _listed[_half].AddRange(offsets.Slice(done, count));
                _position += words * sizeof(ulong);
                done += count;
                EntriesAppended += count;
            }

            _domain.FenceOwned();
            Volatile.Write(ref _fenced, Fenced());
        }
    }

    /// <summary>The halves' laps and ends as they are now (under <see cref="_gate"/>, once they are durable).</summary>
    private FencedEnds Fenced() => _half == 0 ? new(_lap, _position, _otherLap, _otherEnd) : new(_otherLap, _otherEnd, _lap, _position);

    /// <summary>Each half's lap and where its batches end (file offsets), all durable.</summary>
    private sealed record FencedEnds(long Lap0, long End0, long Lap1, long End1);

    /// <summary>
    /// A cycle's mark, written back in the cycle's fence (the caller fences): where each half's batches end, with the
    /// halves' laps and the log's epoch, into the older of the two mark records in the superblock
    /// (<see cref="HeapLayout.SweepLogMarksOffset"/>). It takes the ends published after the log's last fence, not the
    /// appends in flight (nor one whose fence failed), so a crash can leave the log short of a mark only by damage:
    /// recovery then refuses it, or salvages it reported (<see cref="ReadMarks"/>), where it used to take the damaged
    /// batches for the log's end and lose their frees without a word. It does not wait for a sweep's append or a turn.
    /// Nothing is written while the log has not changed since the last mark.
    /// </summary>
    /// <remarks>A record is six words written in place, so a crash can tear it: it then fails its check and says nothing,
    /// while the other record still holds the previous mark. Both stay true of an intact log: within a lap a half's
    /// batches only grow, a new lap or a new epoch voids the mark (it names the lap and the epoch it saw).</remarks>
    internal void WriteBackMark()
    {
        using (InterruptShield.Hold(_markGate))
        {
            // Volatile.Read: acquire; pairs with the release that published the ends after their fence.
            FencedEnds now = Volatile.Read(ref _fenced);
            if (now == _marked)
            {
                return;
            }

            long offset = HeapLayout.SweepLogMarksOffset + (_nextMark * HeapLayout.SweepLogMarkBytes);
            ulong* record = (ulong*)(_base + offset);
            record[0] = (ulong)_epoch;
            record[1] = (ulong)now.Lap0;
            record[2] = (ulong)now.End0;
            record[3] = (ulong)now.Lap1;
            record[4] = (ulong)now.End1;
            record[5] = MarkCheck(record, offset);
            _domain.WriteBackOwned(offset, MarkWords * sizeof(ulong));
            _marked = now;
            _nextMark ^= 1;
        }
    }

    /// <summary>Whether the last mark records the log as it is durable now: nothing was appended or turned since (a cycle then has no mark to write).</summary>
    internal bool MarkIsCurrent
    {
        get
        {
            using (InterruptShield.Hold(_markGate))
            {
                // Volatile.Read: acquire; pairs with the release that published the ends after their fence.
                return Volatile.Read(ref _fenced) == _marked;
            }
        }
    }

    /// <summary>
    /// The marks of the heap image at <paramref name="p"/> that hold for its log (<see cref="WriteBackMark"/>): per
    /// half, a lap and where that lap's batches reached when a cycle recorded it. A record that fails its check, names
    /// another epoch than <paramref name="epoch"/>, or an end outside its half, is left out.
    /// </summary>
    /// <param name="p">The heap image.</param>
    /// <param name="maxSegments">Its table's capacity.</param>
    /// <param name="dataStart">Where its segments start (the log's end).</param>
    /// <param name="epoch">The log's epoch.</param>
    /// <param name="anyEpoch">Broken control: records of an older epoch are taken too (the marks of a log that a recovery
    /// scan has emptied since).</param>
    internal static List<(int Half, long Lap, long End)> ReadMarks(byte* p, long maxSegments, long dataStart, long epoch, bool anyEpoch = false)
    {
        long start = HeapLayout.SweepLogStart(maxSegments);
        long half = (dataStart - start) / 2;
        var marks = new List<(int Half, long Lap, long End)>();
        for (int r = 0; r < 2; r++)
        {
            long offset = HeapLayout.SweepLogMarksOffset + (r * HeapLayout.SweepLogMarkBytes);
            ulong* record = (ulong*)(p + offset);
            if (record[5] != MarkCheck(record, offset) || ((long)record[0] != epoch && !anyEpoch))
            {
                continue;
            }

            for (int h = 0; h < 2; h++)
            {
                long end = (long)record[2 + (2 * h)];
                long lapOffset = start + (h * half);
                if (end >= lapOffset + sizeof(ulong) && end <= lapOffset + half)
                {
                    marks.Add((h, (long)record[1 + (2 * h)], end));
                }
            }
        }

        return marks;
    }

    /// <summary>The highest lap <paramref name="marks"/> name for half <paramref name="h"/>; -1 when none does.</summary>
    private static long MarkedLap(List<(int Half, long Lap, long End)> marks, int h)
    {
        long lap = -1;
        foreach ((int half, long markedLap, _) in marks)
        {
            lap = half == h ? Math.Max(lap, markedLap) : lap;
        }

        return lap;
    }

    /// <summary>Words of a mark record: the epoch, each half's lap and end, the check.</summary>
    private const int MarkWords = 6;

    /// <summary>XxHash3 (System.IO.Hashing) of a mark record's first five words, seeded with its offset.</summary>
    private static ulong MarkCheck(ulong* record, long offset) =>
        System.IO.Hashing.XxHash3.HashToUInt64(new ReadOnlySpan<byte>(record, (MarkWords - 1) * sizeof(ulong)), offset ^ MarkSeed);

    /// <summary>Mixed into the mark records' seed ("SWPMARKS"), so that no other checked word of the file is a valid record.</summary>
    private const long MarkSeed = 0x534B_5241_4D50_5753;

    /// <summary>
    /// Turns to the other half: writes back the headers of its listed blocks not sealed in a durable version, fences,
    /// then gives it its new lap (written back and fenced on its own).
    /// </summary>
    private void Turn()
    {
        int other = 1 - _half;
        List<long> listed = _listed[other];
        var runs = new WriteBackRuns(_domain);
        if (!RetireWithoutWritingBackForTesting)
        {
            // One ascending run per batch (a sweep hands its blocks out in address order): sorted by merging the runs, or
            // by a radix sort when there are many, not by a comparison sort.
            AscendingRuns.Sort(CollectionsMarshal.AsSpan(listed), ref _sortScratch);
            WriteBackUnsealed(listed, _file.DurableFrontier, ref runs);
            runs.Flush();
        }

        // Also makes this half's batches durable (they are, or will be, fenced by their appends anyway).
        _domain.FenceOwned();
        long lapOffset = _start + (other * _halfBytes);
        _maxLap++;
        // Volatile.Write: one aligned 8-byte store (failure-atomic), after the fence above: the half's entries are
        // retired only once the frees they held are durable in the blocks. Fenced alone, before the first batch of the
        // new lap overwrites the old batches: a batch of the new lap durable under the old lap word would void the
        // half's first batch while old, valid batches of that lap follow it, which recovery reports as damage.
        Volatile.Write(ref *(ulong*)(_base + lapOffset), HeapLayout.Seal(_maxLap, (int)lapOffset));
        if (LapFencedWithNextBatchForTesting)
        {
            _domain.WriteBackOwned(lapOffset, sizeof(ulong));
        }
        else
        {
            _domain.PersistOwned(lapOffset, sizeof(ulong));
        }

        listed.Clear();
        _otherEnd = _position;
        _otherLap = _lap;
        _half = other;
        _lap = _maxLap;
        _position = lapOffset + sizeof(ulong);
        // The old half's batches were fenced above, the new lap persisted: both durable.
        Volatile.Write(ref _fenced, Fenced());
        Turns++;
        AfterTurnForTesting?.Invoke();
    }

    /// <summary>Adds to <paramref name="runs"/> the header of each of <paramref name="sorted"/> whose working image is not sealed in a version up to <paramref name="frontier"/>.</summary>
    private void WriteBackUnsealed(List<long> sorted, long frontier, ref WriteBackRuns runs)
    {
        foreach (long offset in sorted)
        {
            ulong* h = (ulong*)(_base + offset);
            // Volatile.Read: acquire, pairs with the release of a seal; a block being allocated reads as anything.
            ulong commit = Volatile.Read(ref h[3]);
            ulong epoch = Volatile.Read(ref h[1]);
            bool durableReuse = (commit & (0xFFUL << 56)) == HeapLayout.CommitTag
                && HeapLayout.CommitState(commit) == HeapLayout.StateSealed
                && HeapLayout.VersionTag(commit) == (ushort)epoch
                && epoch <= (ulong)frontier;
            if (!durableReuse)
            {
                runs.Add(offset, HeapLayout.HeaderSize);
                HeadersWrittenBack++;
            }
        }
    }

    /// <summary>
    /// Reads the log of <paramref name="file"/> at open (nothing is written): the blocks its valid batches list, and
    /// where each half's batches end.
    /// </summary>
    /// <param name="file">The heap file.</param>
    /// <param name="salvage">With <see cref="PersistentHeapOptions.SalvageDamagedBlocks"/>: damage does not throw. A
    /// damaged batch is skipped (the valid batches after it are read), a half whose lap word is damaged (or behind a mark) is skipped whole,
    /// and <see cref="Contents.Damaged"/> lists where; the frees they held are lost.</param>
    /// <exception cref="HeapFileException"><see cref="HeapFileError.Corrupt"/>, without <paramref name="salvage"/>: a
    /// half's lap word fails its check or holds a lower lap than a mark of the current epoch names for it (see
    /// <see cref="WriteBackMark"/>), or a batch fails its check and a valid batch of its half's lap follows it (damage,
    /// not a torn append).</exception>
    internal static Contents Read(HeapFile file, bool salvage = false) => Read(file.Pointer, file.MaxSegments, file.DataStart, file.SweepLogEpoch, file.Path, salvage);

    /// <summary>Reads the log of the heap image at <paramref name="p"/> (see the overload that takes the file; tests read file images with it).</summary>
    internal static Contents Read(byte* p, long maxSegments, long dataStart, long epoch, string? path, bool salvage = false)
    {
        long start = HeapLayout.SweepLogStart(maxSegments);
        long half = (dataStart - start) / 2;
        var frees = new LoggedFrees();
        long[] laps = new long[2];
        long[] ends = new long[2];
        List<long>[] listed = [new List<long>(), new List<long>()];
        var damaged = new List<long>();
        List<(int Half, long Lap, long End)> marks = ReadMarks(p, maxSegments, dataStart, epoch);
        for (int h = 0; h < 2; h++)
        {
            long lapOffset = start + (h * half);
            long end = start + ((h + 1) * half);
            bool intact = HeapLayout.TryUnseal(*(ulong*)(p + lapOffset), (int)lapOffset, out long lap);

            // A lap word is durable before any mark names its lap, and laps only grow within an epoch: a mark of a higher
            // lap means the word went back (a lost write of a turn's lap), and the half's newer batches are unreadable.
            long markedLap = intact ? MarkedLap(marks, h) : -1;
            if (markedLap > lap)
            {
                if (!salvage)
                {
                    ThrowHelper.ThrowHeapFile(HeapFileError.Corrupt, $"Cannot open heap file '{path}': the sweep log's lap word at file offset {lapOffset} holds lap {lap}, but an advance of the heap found lap {markedLap} there (a write to the file was lost, or damage); the frees the log holds cannot be trusted. Restore the file from a copy, or open it with SalvageDamagedBlocks = true to go on without the frees of that half of the log (the recovery report lists where it was damaged).");
                }

                damaged.Add(lapOffset);
                ends[h] = lapOffset + sizeof(ulong);
                continue;
            }

            if (!intact)
            {
                if (!salvage)
                {
                    ThrowHelper.ThrowHeapFile(HeapFileError.Corrupt, $"Cannot open heap file '{path}': the sweep log's lap word at file offset {lapOffset} fails its check (damaged); the frees the log holds cannot be trusted. Restore the file from a copy, or open it with SalvageDamagedBlocks = true to go on without the frees of that half of the log (the recovery report lists where it was damaged).");
                }

                // No batch of the half can be checked without its lap: the half is skipped whole.
                damaged.Add(lapOffset);
                ends[h] = lapOffset + sizeof(ulong);
                continue;
            }

            laps[h] = lap;
            long position = lapOffset + sizeof(ulong);
            while (true)
            {
                while (TryReadBatch(p, position, end, epoch, lap, out long words))
                {
                    ulong* batch = (ulong*)(p + position);
                    for (long i = 1; i < words - 1; i += 2)
                    {
                        long offset = (long)(batch[i] & OffsetMask);
                        frees.Add(offset, (ushort)(batch[i] >> 48), batch[i + 1]);
                        listed[h].Add(offset);
                    }

                    position += words * sizeof(ulong);
                }

                // The first batch that fails: the last append, torn, unless a valid one of this lap follows.
                long next = NextValidBatch(p, position, end, epoch, lap);
                if (next < 0)
                {
                    break;
                }

                if (!salvage)
                {
                    ThrowHelper.ThrowHeapFile(HeapFileError.Corrupt, $"Cannot open heap file '{path}': the sweep log's batch at file offset {position} fails its check, and a valid batch at {next} follows it (damage, not an append a crash interrupted); the frees it held cannot be trusted. Restore the file from a copy, or open it with SalvageDamagedBlocks = true to go on without the frees of that batch (the recovery report lists where the log was damaged).");
                }

                damaged.Add(position);
                position = next;
            }

            ends[h] = position;
        }

        return new Contents(laps, ends, listed, frees, damaged);
    }

    /// <summary>The file offset of the first valid batch of <paramref name="lap"/> after the one at <paramref name="position"/>, which fails its check; -1 if none.</summary>
    private static long NextValidBatch(byte* p, long position, long end, long epoch, long lap)
    {
        for (long q = position + sizeof(ulong); q + (3 * sizeof(ulong)) <= end; q += sizeof(ulong))
        {
            if (TryReadBatch(p, q, end, epoch, lap, out _))
            {
                return q;
            }
        }

        return -1;
    }

    private static bool TryReadBatch(byte* p, long position, long end, long epoch, long lap, out long words)
    {
        words = 0;
        if (position + (3 * sizeof(ulong)) > end)
        {
            return false;
        }

        ulong header = *(ulong*)(p + position);
        if ((header & (0xFFUL << 56)) != BatchTag || ((header >> 32) & LapMask) != ((ulong)lap & LapMask))
        {
            return false;
        }

        long count = (uint)header;
        if (count == 0 || position + (((2 * count) + 2) * sizeof(ulong)) > end)
        {
            return false;
        }

        words = (2 * count) + 2;
        return *(ulong*)(p + position + ((words - 1) * sizeof(ulong))) == Check((ulong*)(p + position), words - 1, epoch, lap, position);
    }

    /// <summary>XxHash3 (System.IO.Hashing) of a batch's header and entries, seeded with the epoch, the lap and the batch's offset.</summary>
    private static ulong Check(ulong* words, long count, long epoch, long lap, long position)
    {
        Span<ulong> seed = [(ulong)epoch, (ulong)lap, (ulong)position];
        long seedHash = (long)System.IO.Hashing.XxHash3.HashToUInt64(System.Runtime.InteropServices.MemoryMarshal.AsBytes(seed));
        return System.IO.Hashing.XxHash3.HashToUInt64(new ReadOnlySpan<byte>(words, checked((int)(count * sizeof(ulong)))), seedHash);
    }

    /// <summary>
    /// What <see cref="Read(HeapFile, bool)"/> found: per half its lap, where its batches end and the blocks they list;
    /// the entries by block; and, when it salvaged, the file offsets of the damaged batches and lap words it skipped.
    /// </summary>
    internal sealed record Contents(long[] Laps, long[] Ends, List<long>[] Listed, LoggedFrees Frees, List<long> Damaged);

    /// <summary>The entries of a log read at recovery, by block offset (a block may be listed more than once).</summary>
    internal sealed class LoggedFrees
    {
        private readonly Dictionary<long, int> _first = new();
        private readonly List<(ulong Commit, ushort EpochBits, int Next)> _entries = new();

        internal int Count => _entries.Count;

        /// <summary>Whether <paramref name="commit"/> is a commit word logged for the block at <paramref name="offset"/>.</summary>
        internal bool IsLogged(long offset, ulong commit)
        {
            for (int i = _first.TryGetValue(offset, out int first) ? first : -1; i >= 0; i = _entries[i].Next)
            {
                if (_entries[i].Commit == commit)
                {
                    return true;
                }
            }

            return false;
        }

        /// <summary>Every entry: the block and its logged commit word.</summary>
        internal IEnumerable<(long Offset, ulong Commit)> Entries
        {
            get
            {
                foreach ((long offset, int first) in _first)
                {
                    for (int i = first; i >= 0; i = _entries[i].Next)
                    {
                        yield return (offset, _entries[i].Commit);
                    }
                }
            }
        }

        internal void Add(long offset, ushort epochBits, ulong commit)
        {
            int next = _first.TryGetValue(offset, out int first) ? first : -1;
            _first[offset] = _entries.Count;
            _entries.Add((commit, epochBits, next));
        }

        /// <summary>
        /// How the log reclassifies the block at <paramref name="offset"/> whose header holds
        /// <paramref name="commit"/> and <paramref name="epoch"/>, classified <paramref name="state"/> without the log
        /// (see the remarks on <see cref="SweepLog"/>): free (<see cref="BlockState.Torn"/>, to be freed durably) when
        /// its commit word is a logged one, or when it is damaged as a seal of <paramref name="inFlightVersion"/> over
        /// a logged Epoch word; otherwise <paramref name="state"/>.
        /// </summary>
        internal BlockState Reclassify(long offset, ulong commit, ulong epoch, BlockState state, long inFlightVersion)
        {
            if (!_first.TryGetValue(offset, out int i))
            {
                return state;
            }

            bool tornSeal = state == BlockState.Damaged && inFlightVersion > 0
                && (commit & (0xFFUL << 56)) == HeapLayout.CommitTag
                && HeapLayout.CommitState(commit) == HeapLayout.StateSealed
                && HeapLayout.VersionTag(commit) == (ushort)inFlightVersion;
            for (; i >= 0; i = _entries[i].Next)
            {
                if (_entries[i].Commit == commit || (tornSeal && _entries[i].EpochBits == (ushort)epoch))
                {
                    return BlockState.Torn;
                }
            }

            return state;
        }
    }
}
