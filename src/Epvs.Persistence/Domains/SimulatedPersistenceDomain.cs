using System;
using System.Collections.Generic;
using System.Runtime.CompilerServices;
using System.Runtime.InteropServices;
using System.Threading;

namespace Epvs.Persistence;

/// <summary>
/// A persistence domain for tests that keeps the <em>working image</em> (what loads and stores see) apart from the
/// <em>durable image</em> (what survives a power failure), and produces adversarial crash images.
/// </summary>
/// <remarks>
/// <para>Model. <see cref="PersistenceDomain.WriteBack(long, long)"/> snapshots the 64-byte lines of the range into the
/// calling thread's pending list; <see cref="PersistenceDomain.Fence"/> makes the calling thread's pending snapshots
/// durable (a line never goes back to an older snapshot: snapshots carry a global sequence number).
/// <see cref="Crash(int)"/> starts from the durable image, lets each pending (written back, not fenced) snapshot reach
/// it or not, and then lets every 8-byte word whose working value still differs reach it or not — a cache may evict
/// any dirty line at any time, and we do not even assume that the words of one line travel together. The choices
/// come from a <see cref="Random"/> seeded by the caller; the seed also picks the probabilities (0, 0.1, 0.5, 0.9
/// or 1), so one seed drops everything and another keeps almost everything.</para>
/// <para>Not modeled: a word reaching the medium with a value older than its current one but newer than its durable
/// one (only the durable and the current value are candidates).</para>
/// <para>Crash points. Every write-back and every fence is one crash point, numbered from 0 in the order they take
/// the domain's lock. <see cref="ArmCrash(long, int)"/> captures an image at a point (just before that event takes
/// effect) while the workload goes on, so one run can enumerate every point or sample random ones.</para>
/// <para>All events serialize on one lock: this domain is for correctness tests, not speed.</para>
/// </remarks>
public sealed unsafe class SimulatedPersistenceDomain : PersistenceDomain
{
    /// <summary>The cache-line size the model writes back, in bytes.</summary>
    public const int LineSize = 64;

    private static readonly double[] s_probabilities = [0.0, 0.1, 0.5, 0.9, 1.0];

    private readonly byte* _durable;
    private readonly long _capacity;
    private readonly long[] _lineSequence;
    private readonly object _gate = new();

    /// <summary>Set under <see cref="_gate"/> when Dispose frees the images.</summary>
    private bool _freed;
    private readonly ThreadLocal<PendingLines> _pending = new(() => new PendingLines(), trackAllValues: true);
    private readonly Dictionary<long, List<int>> _armed = new();
    private readonly List<SimulatedCrash> _captured = new();
    private long _sequence;
    private long _crashPoints;

    /// <summary>Creates a zero-filled domain of <paramref name="length"/> bytes that can grow to <paramref name="capacity"/>.</summary>
    /// <param name="length">Initial length; a positive multiple of <see cref="LineSize"/>.</param>
    /// <param name="capacity">Maximum length for <see cref="PersistenceDomain.TryGrow(long)"/>; 0 means <paramref name="length"/>.
    /// A growth to a length that is not a multiple of <see cref="LineSize"/> returns false.</param>
    /// <exception cref="ArgumentOutOfRangeException">A size is not a positive multiple of <see cref="LineSize"/>, or capacity is below length.</exception>
    public SimulatedPersistenceDomain(long length, long capacity = 0)
        : this(Allocate(length, ref capacity), length, capacity)
    {
    }

    private SimulatedPersistenceDomain(byte* working, long length, long capacity)
        : base(working, length)
    {
        _capacity = capacity;
        _durable = (byte*)NativeMemory.AllocZeroed((nuint)capacity);
        _lineSequence = new long[capacity / LineSize];
    }

    /// <inheritdoc/>
    public override PersistenceDomainKind Kind => PersistenceDomainKind.Simulated;

    /// <inheritdoc/>
    public override bool IsPersistentMemory => true;

    /// <inheritdoc/>
    public override long Capacity => _capacity;

    /// <summary>
    /// Test hook: the domain reports that it writes back by copy, as a private mapping of a file does, so that a clean
    /// <see cref="HeapFile"/> Dispose persists only what was written back, not every word the working image changed.
    /// </summary>
    internal bool WritesBackByCopyForTesting { get; set; }

    /// <inheritdoc/>
    internal override bool WritesBackByCopy => WritesBackByCopyForTesting;

    /// <summary>The number of crash points (write-backs plus fences) so far; the next event has this index.</summary>
    public long CrashPointCount
    {
        get
        {
            // Volatile.Read: acquire; pairs with the Volatile.Write under the lock in BeginEvent. A thread that reads
            // a value greater than p knows the image armed at p has been captured.
            return Volatile.Read(ref _crashPoints);
        }
    }

    /// <summary>The images captured at armed crash points so far, in capture order.</summary>
    public IReadOnlyList<SimulatedCrash> CapturedCrashes
    {
        get
        {
            using (InterruptShield.Hold(_gate))
            {
                return _captured.ToArray();
            }
        }
    }

    /// <summary>Creates a domain whose working and durable images both hold <paramref name="image"/> (a crash image, typically).</summary>
    /// <param name="image">The bytes; a positive multiple of <see cref="LineSize"/> long.</param>
    /// <param name="capacity">Maximum length for growth; 0 means the image's length.</param>
    /// <returns>The new domain.</returns>
    public static SimulatedPersistenceDomain FromImage(ReadOnlySpan<byte> image, long capacity = 0)
    {
        var domain = new SimulatedPersistenceDomain(image.Length, capacity);
        image.CopyTo(new Span<byte>(domain.Pointer, image.Length));
        image.CopyTo(new Span<byte>(domain._durable, image.Length));
        return domain;
    }

    /// <summary>
    /// Arms a crash at <paramref name="point"/>: when the event with that index is about to take effect, the image
    /// <see cref="Crash(int)"/> would return with <paramref name="seed"/> is captured into <see cref="CapturedCrashes"/>.
    /// The workload is not interrupted. Several seeds may be armed at one point.
    /// </summary>
    /// <exception cref="ArgumentOutOfRangeException">The point has already passed.</exception>
    /// <exception cref="ObjectDisposedException">The domain has been disposed (no event can reach the point any more).</exception>
    public void ArmCrash(long point, int seed)
    {
        using (InterruptShield.Hold(_gate))
        {
            // First: after a Dispose, a point still ahead was armed without a word and never captured, and one passed
            // was refused as passed.
            ThrowIfFreed();
            if (point < _crashPoints)
            {
                ThrowHelper.ThrowArgumentOutOfRange(nameof(point), $"Crash point {point} has already passed (the next one is {_crashPoints}).");
            }

            if (!_armed.TryGetValue(point, out List<int>? seeds))
            {
                _armed[point] = seeds = new List<int>();
            }

            seeds.Add(seed);
        }
    }

    /// <summary>
    /// Simulates a power failure now: returns the durable image plus a seeded random subset of the pending write-backs
    /// and of the dirty 8-byte words (see the class remarks). The domain itself is unchanged.
    /// </summary>
    /// <param name="seed">Chooses what survives; the same seed and history give the same image.</param>
    /// <returns>A copy of what the medium would hold.</returns>
    /// <exception cref="ObjectDisposedException">The domain has been disposed.</exception>
    public byte[] Crash(int seed)
    {
        using (InterruptShield.Hold(_gate))
        {
            ThrowIfFreed();
            return BuildCrashImage(seed);
        }
    }

    /// <summary>Returns a copy of the durable image: what survives if no unflushed store happens to reach the medium.</summary>
    /// <returns>A copy of the durable bytes.</returns>
    /// <exception cref="ObjectDisposedException">The domain has been disposed.</exception>
    public byte[] GetDurableImage()
    {
        using (InterruptShield.Hold(_gate))
        {
            ThrowIfFreed();
            return new ReadOnlySpan<byte>(_durable, checked((int)Length)).ToArray();
        }
    }

    /// <inheritdoc/>
    protected override void Dispose(bool disposing)
    {
        if (disposing)
        {
            _pending.Dispose();
        }

        // Under the gate: a Crash or GetDurableImage that holds it finishes first, and one after it sees the images freed
        // (they used to read the freed memory: an access violation).
        using (InterruptShield.Hold(_gate))
        {
            _freed = true;
            NativeMemory.Free(Pointer);
            NativeMemory.Free(_durable);
        }
    }

    /// <summary>Under <see cref="_gate"/>: the images were freed (the domain was disposed).</summary>
    private void ThrowIfFreed()
    {
        if (_freed)
        {
            ThrowHelper.ThrowObjectDisposed(this);
        }
    }

    /// <summary>Frees the images if the domain was not disposed.</summary>
    /// <remarks>Also runs for a domain whose public constructor threw (a bad length, out of memory): its argument's
    /// allocation fails before any field is set, so there is no gate and nothing to free. Disposing it anyway threw on
    /// the finalizer thread, which ended the process.</remarks>
    ~SimulatedPersistenceDomain()
    {
        if (_gate is not null)
        {
            Dispose(false);
        }
    }

    private protected override void WriteBackCore(long offset, long length)
    {
        if (length == 0)
        {
            return;
        }

        PendingLines pending = _pending.Value!;
        using (InterruptShield.Hold(_gate))
        {
            // Under the gate, as in Crash: a call that the domain's Dispose did not wait for (its test control) never
            // copies from or into freed images.
            ThrowIfFreed();
            BeginEvent();
            for (long line = offset / LineSize, last = (offset + length - 1) / LineSize; line <= last; line++)
            {
                pending.Add(line, ++_sequence, (long*)(Pointer + (line * LineSize)));
            }
        }
    }

    private protected override void FenceCore()
    {
        PendingLines pending = _pending.Value!;
        using (InterruptShield.Hold(_gate))
        {
            ThrowIfFreed();
            BeginEvent();
            for (int i = 0; i < pending.Count; i++)
            {
                long line = pending.Lines[i];
                if (pending.Sequences[i] > _lineSequence[line])
                {
                    _lineSequence[line] = pending.Sequences[i];
                    CopyLine(pending.Data(i), (long*)(_durable + (line * LineSize)));
                }
            }

            pending.Clear();
        }
    }

    private protected override bool TryGrowCore(long newLength) => newLength % LineSize == 0;

    private static byte* Allocate(long length, ref long capacity)
    {
        if (capacity == 0)
        {
            capacity = length;
        }

        if (length <= 0 || length % LineSize != 0 || capacity < length || capacity % LineSize != 0)
        {
            ThrowHelper.ThrowArgumentOutOfRange(nameof(length), $"Length ({length}) and capacity ({capacity}) must be positive multiples of {LineSize}, capacity at least length.");
        }

        return (byte*)NativeMemory.AllocZeroed((nuint)capacity);
    }

    private static void CopyLine(long* from, long* to)
    {
        // Word by word: an aligned 8-byte load or store is atomic, so a word that another thread is storing is seen
        // whole (old or new), like on the real medium.
        for (int w = 0; w < LineSize / sizeof(long); w++)
        {
            to[w] = from[w];
        }
    }

    // Called under _gate.
    private void BeginEvent()
    {
        if (_armed.Count != 0 && _armed.Remove(_crashPoints, out List<int>? seeds))
        {
            foreach (int seed in seeds)
            {
                _captured.Add(new SimulatedCrash(_crashPoints, seed, BuildCrashImage(seed)));
            }
        }

        // Volatile.Write: release; pairs with CrashPointCount's acquire: the capture above happens-before any thread
        // that sees the incremented count.
        Volatile.Write(ref _crashPoints, _crashPoints + 1);
    }

    // Called under _gate.
    private byte[] BuildCrashImage(int seed)
    {
        var random = new Random(seed);
        double lineProbability = s_probabilities[random.Next(s_probabilities.Length)];
        double wordProbability = s_probabilities[random.Next(s_probabilities.Length)];
        long length = Length;
        byte[] image = new byte[length];
        fixed (byte* imagePointer = image)
        {
            Buffer.MemoryCopy(_durable, imagePointer, length, length);

            // Pending write-backs of every thread, oldest first; a line never regresses to an older snapshot.
            var candidates = new List<(long Sequence, long Line, PendingLines Owner, int Index)>();
            foreach (PendingLines pending in _pending.Values)
            {
                for (int i = 0; i < pending.Count; i++)
                {
                    candidates.Add((pending.Sequences[i], pending.Lines[i], pending, i));
                }
            }

            candidates.Sort((a, b) => a.Sequence.CompareTo(b.Sequence));
            var applied = new Dictionary<long, long>();
            foreach ((long sequence, long line, PendingLines owner, int index) in candidates)
            {
                if (line * LineSize >= length || random.NextDouble() >= lineProbability)
                {
                    continue;
                }

                long floor = applied.TryGetValue(line, out long seen) ? seen : _lineSequence[line];
                if (sequence > floor)
                {
                    applied[line] = sequence;
                    CopyLine(owner.Data(index), (long*)(imagePointer + (line * LineSize)));
                }
            }

            // Dirty words: anything still different from the working image may or may not have been evicted.
            long* working = (long*)Pointer;
            long* result = (long*)imagePointer;
            for (long w = 0, words = length / sizeof(long); w < words; w++)
            {
                long value = working[w];
                if (value != result[w] && random.NextDouble() < wordProbability)
                {
                    result[w] = value;
                }
            }
        }

        return image;
    }

    /// <summary>One thread's written-back, not yet fenced line snapshots. Touched only under the domain's lock.</summary>
    private sealed class PendingLines
    {
        private const int WordsPerLine = LineSize / sizeof(long);

        // Pinned (pinned object heap), so Data can hand out raw pointers.
        private long[] _data = GC.AllocateArray<long>(16 * WordsPerLine, pinned: true);

        internal long[] Lines { get; private set; } = new long[16];

        internal long[] Sequences { get; private set; } = new long[16];

        internal int Count { get; private set; }

        internal void Add(long line, long sequence, long* source)
        {
            if (Count == Lines.Length)
            {
                long[] data = GC.AllocateArray<long>(_data.Length * 2, pinned: true);
                _data.CopyTo(data, 0);
                _data = data;
                long[] lines = Lines, sequences = Sequences;
                Array.Resize(ref lines, lines.Length * 2);
                Array.Resize(ref sequences, sequences.Length * 2);
                Lines = lines;
                Sequences = sequences;
            }

            Lines[Count] = line;
            Sequences[Count] = sequence;
            CopyLine(source, Data(Count));
            Count++;
        }

        internal long* Data(int index) =>
            (long*)Unsafe.AsPointer(ref MemoryMarshal.GetArrayDataReference(_data)) + (index * WordsPerLine);

        internal void Clear() => Count = 0;
    }
}
