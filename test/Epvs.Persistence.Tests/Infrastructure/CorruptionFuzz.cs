using System;
using System.Collections.Generic;
using System.IO;
using System.Linq;
using System.Threading;

namespace Epvs.Persistence.Tests;

/// <summary>
/// Child-process corruption fuzz of a cleanly closed buffered heap that went through churn (a hash map, a byte map
/// of values in several size classes whose segments were released and reused and of large values, a queue): one kind of damage beyond a
/// single bit flip per case — "garbage" (a run of random bytes), "zero-page" (a 4 KiB page zeroed), "swap-pages" (two
/// 4 KiB pages exchanged), "ff-page" (a page of 0xFF), "copy-page" and "copy-run" (a misdirected write: a page, or 2–16
/// pages, copied over others of the file), "zero-run" (2–32 pages zeroed), "swap-segments" (two 64 KiB segments exchanged), "swap-descriptors" (two descriptor words
/// exchanged), "copy-descriptor" (one descriptor word copied over another), "truncate" (cut into the data, and
/// optionally extended again with zeros), "extend" (bytes appended), "fuzz" (random bytes of the whole file
/// replaced). Each case reopens the damaged copy twice, in the clean image and as after a crash (clean flag cleared):
/// by default it must be refused or recover exactly; with <c>SalvageDamagedBlocks</c> every surviving entry must hold
/// a value its key once had durably, no more entries may be lost or changed than it lists damaged blocks, and the next
/// open (no salvage) must report no damage and find what the salvage kept; an open that reports no damage must be exact. Seeds are fixed
/// (<see cref="Seed"/> + case); <c>EPVS_CORRUPTION_FUZZ_CASES</c> raises the count per kind. Exits 0 when nothing was
/// silently wrong; an unexpected exception type is reported too. A crash kills the child, which the test sees.
/// </summary>
internal static class CorruptionFuzz
{
    internal const string Role = "corruption-fuzz";
    internal const int Seed = 20261124;
    private const int MapType = 1;
    private const int BytesType = 2;
    private const int QueueType = 3;

    internal static int Run(string directory, string kind, bool control)
    {
        if (kind == "copy-mid-write")
        {
            return CopyMidWrite(directory);
        }

        if (kind == "raw")
        {
            return RawHeap(directory);
        }

        string path = Path.Combine(directory, "fuzz.heap");
        Image image = Build(path);
        byte[] original = File.ReadAllBytes(path);
        int cases = int.TryParse(Environment.GetEnvironmentVariable("EPVS_CORRUPTION_FUZZ_CASES"), out int n) && n > 0 ? n : DefaultCases(kind);
        HeapFileTestHooks.IgnoreSeals = control;
        var totals = new Dictionary<string, int>();
        int bad = 0;
        for (int c = 0; c < cases && !(control && bad > 0); c++)
        {
            // (The control only has to be caught once.)
            var random = new Random(Seed + (c * 7919) + StableHash(kind));
            byte[] damaged = Corrupt(original, kind, random, image, out string what);
            foreach (bool crashed in new[] { false, true })
            {
                byte[] copy = (byte[])damaged.Clone();
                if (crashed && copy.Length >= HeapLayout.SuperblockSize)
                {
                    BitConverter.GetBytes(HeapLayout.Seal(0, HeapLayout.CleanShutdownOffset)).CopyTo(copy, HeapLayout.CleanShutdownOffset);
                }

                foreach (bool salvage in new[] { false, true })
                {
                    File.WriteAllBytes(path, copy);
                    string outcome = Check(path, image, salvage);
                    string key = $"{(salvage ? "salvage" : "default")}:{outcome.Split(':')[0]}";
                    totals[key] = totals.GetValueOrDefault(key) + 1;
                    if (outcome.StartsWith("SILENT", StringComparison.Ordinal) || outcome.StartsWith("UNEXPECTED", StringComparison.Ordinal))
                    {
                        bad++;
                        Console.WriteLine($"case {c} ({what}, {(crashed ? "crashed" : "clean")}, {(salvage ? "salvage" : "default")}): {outcome}");
                    }
                }
            }
        }

        Console.WriteLine($"kind={kind} cases={cases} {string.Join(' ', totals.OrderBy(t => t.Key).Select(t => $"{t.Key}={t.Value}"))} bad={bad}");
        return bad == 0 ? SafetyChild.Survived : SafetyChild.WrongOutcome;
    }

    /// <summary>
    /// "copy-mid-write": a file copied in 64 KiB chunks (as cp does, without taking the heap's lock) while a writer and
    /// the advancer change it, so the copy mixes pages of different moments — a lost write in the words of the README,
    /// which no check can tell from a consistent file. Whatever the copy holds, opening it must be refused or succeed,
    /// never crash; an exception other than HeapFileException or InvalidDataException is reported as unexpected.
    /// </summary>
    private static int CopyMidWrite(string directory)
    {
        int rounds = int.TryParse(Environment.GetEnvironmentVariable("EPVS_CORRUPTION_FUZZ_CASES"), out int n) && n > 0 ? n : 12;
        var totals = new Dictionary<string, int>();
        int bad = 0;
        for (int round = 0; round < rounds; round++)
        {
            string path = Path.Combine(directory, $"live{round}.heap");
            string copy = Path.Combine(directory, $"copy{round}.heap");
            var random = new Random(Seed + round);
            using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, new HeapFileOptions { Size = 2L << 20, MaxSize = 2L << 20, Domain = PersistenceDomainKind.MappedFile, MappedFileWriteBack = round % 2 == 0 ? MappedFileWriteBack.SharedMapping : MappedFileWriteBack.PrivateMapping }, new BufferedDurableHeapOptions { AdvancePeriod = TimeSpan.FromMilliseconds(1) }))
            {
                var map = new PersistentHashMap<long, long>(heap, MapType);
                var bytes = new PersistentByteMap<long>(heap, BytesType);
                var queue = new PersistentQueue<long>(heap, QueueType);
                using var stop = new CancellationTokenSource();
                Exception? writerFault = null;
                var writer = new Thread(() =>
                {
                    try
                    {
                        var r = new Random(Seed - round);
                        long next = 0;
                        while (!stop.IsCancellationRequested)
                        {
                            long k = r.Next(300);
                            if (r.Next(4) == 0)
                            {
                                map.Remove(k);
                                bytes.Remove(k % 50);
                                queue.TryDequeue(out _);
                            }
                            else
                            {
                                map.Set(k, r.NextInt64());
                                bytes.Set(k % 50, new byte[r.Next(3000)]);
                                queue.Enqueue(next++);
                            }
                        }
                    }
                    catch (Exception e)
                    {
                        writerFault = e;
                    }
                });
                writer.Start();
                using (FileStream source = new(new Microsoft.Win32.SafeHandles.SafeFileHandle(OpenForCopy(path), ownsHandle: true), FileAccess.Read))
                using (FileStream target = File.Create(copy))
                {
                    byte[] chunk = new byte[64 << 10];
                    long at = 0;
                    int read;
                    while ((read = RandomAccess.Read(source.SafeFileHandle, chunk, at)) > 0)
                    {
                        target.Write(chunk, 0, read);
                        at += read;

                        // A bounded amount of writing between two chunks (no sleep: the writer runs meanwhile).
                        Thread.Yield();
                    }
                }

                stop.Cancel();
                if (!writer.Join(TimeSpan.FromSeconds(30)) || writerFault is not null)
                {
                    Console.WriteLine($"round {round}: the writer failed: {writerFault}");
                    bad++;
                }
            }

            foreach (bool salvage in new[] { false, true })
            {
                string outcome;
                try
                {
                    using BufferedDurableHeap opened = BufferedDurableHeap.Open(copy, new HeapFileOptions { Domain = PersistenceDomainKind.MappedFile }, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, SalvageDamagedBlocks = salvage });
                    _ = new PersistentHashMap<long, long>(opened, MapType).Count;
                    _ = new PersistentByteMap<long>(opened, BytesType).ToList().Count;
                    _ = new PersistentQueue<long>(opened, QueueType).ToArray().Length;
                    outcome = "opened";
                }
                catch (Exception e) when (e is HeapFileException or InvalidDataException)
                {
                    outcome = "refused";
                }
                catch (Exception e)
                {
                    outcome = "UNEXPECTED";
                    bad++;
                    Console.WriteLine($"round {round} ({(salvage ? "salvage" : "default")}): {e}");
                }

                string key = $"{(salvage ? "salvage" : "default")}:{outcome}";
                totals[key] = totals.GetValueOrDefault(key) + 1;
            }

            File.Delete(path);
            File.Delete(copy);
        }

        Console.WriteLine($"kind=copy-mid-write rounds={rounds} {string.Join(' ', totals.OrderBy(t => t.Key).Select(t => $"{t.Key}={t.Value}"))} bad={bad}");
        return bad == 0 ? SafetyChild.Survived : SafetyChild.WrongOutcome;
    }

    /// <summary>
    /// "raw": a raw <see cref="PersistentHeap"/> (never sealed: its payloads are not checked, so there is no oracle for
    /// their bytes) of small and large blocks, some freed, damaged by each of the other kinds in turn. Every damaged
    /// copy must open or be refused, by default and salvaging, and every block it then reports allocated must be
    /// readable whole (header and payload inside the heap) — never a crash, never an unexpected exception.
    /// </summary>
    private static int RawHeap(string directory)
    {
        string path = Path.Combine(directory, "raw.heap");
        var random = new Random(Seed);
        using (PersistentHeap heap = PersistentHeap.Create(path, new HeapFileOptions { Size = (2L << 20) + HeapLayout.MinSweepLogBytes, MaxSize = (2L << 20) + HeapLayout.MinSweepLogBytes, Domain = PersistenceDomainKind.MappedFile }))
        {
            var blocks = new List<PayloadRef>();
            for (int i = 0; i < 300; i++)
            {
                int size = i % 50 == 49 ? 20_000 + random.Next(60_000) : random.Next(3000);
                PayloadRef block = heap.Allocate(size, typeId: 1 + (i % 3));
                random.NextBytes(heap.GetPayload(block));
                heap.Persist(block);
                blocks.Add(block);
                if (random.Next(4) == 0)
                {
                    int victim = random.Next(blocks.Count);
                    heap.Free(blocks[victim]);
                    blocks.RemoveAt(victim);
                }
            }
        }

        byte[] original = File.ReadAllBytes(path);
        var image = new Image
        {
            DataStart = BitConverter.ToInt64(original, HeapLayout.DataStartOffset),
            SegmentCount = ((long)(BitConverter.ToUInt64(original, HeapLayout.HeapSizeOffset) & HeapLayout.SealedValueMask) - BitConverter.ToInt64(original, HeapLayout.DataStartOffset)) / HeapLayout.SegmentSize,
        };
        string[] kinds = { "garbage", "zero-page", "swap-pages", "swap-segments", "swap-descriptors", "copy-descriptor", "truncate", "fuzz" };
        int cases = int.TryParse(Environment.GetEnvironmentVariable("EPVS_CORRUPTION_FUZZ_CASES"), out int n) && n > 0 ? n : 10;
        var totals = new Dictionary<string, int>();
        int bad = 0;
        foreach (string kind in kinds)
        {
            for (int c = 0; c < cases; c++)
            {
                byte[] damaged = Corrupt(original, kind, new Random(Seed + (c * 7919) + StableHash(kind)), image, out string what);
                foreach (bool salvage in new[] { false, true })
                {
                    File.WriteAllBytes(path, damaged);
                    string outcome;
                    try
                    {
                        using PersistentHeap heap = PersistentHeap.Open(path, new HeapFileOptions { Domain = PersistenceDomainKind.MappedFile }, new PersistentHeapOptions { SalvageDamagedBlocks = salvage });
                        long sum = 0;
                        heap.ForEachAllocated((block, header) =>
                        {
                            foreach (byte b in heap.GetPayload(block))
                            {
                                Interlocked.Add(ref sum, b);
                            }
                        });
                        outcome = "opened";
                    }
                    catch (HeapFileException)
                    {
                        outcome = "refused";
                    }
                    catch (Exception e)
                    {
                        outcome = "UNEXPECTED";
                        bad++;
                        Console.WriteLine($"{what} ({(salvage ? "salvage" : "default")}): {e}");
                    }

                    totals[outcome] = totals.GetValueOrDefault(outcome) + 1;
                }
            }
        }

        Console.WriteLine($"kind=raw cases={cases}x{kinds.Length} {string.Join(' ', totals.OrderBy(t => t.Key).Select(t => $"{t.Key}={t.Value}"))} bad={bad}");
        return bad == 0 ? SafetyChild.Survived : SafetyChild.WrongOutcome;
    }

    /// <summary>open(2) for reading, without the advisory lock .NET's FileStream would take (and fail to get): what cp does.</summary>
    internal static nint OpenForCopy(string path)
    {
        int fd = LibcOpen(path, 0);
        if (fd < 0)
        {
            throw new IOException($"open({path}) failed: errno {System.Runtime.InteropServices.Marshal.GetLastPInvokeError()}");
        }

        return fd;
    }

    /// <summary>The bytes of the file at <paramref name="path"/> as the file (not a mapping) holds them, read past the heap's lock: what a crash now would leave of a privately mapped heap.</summary>
    internal static byte[] ReadPastTheLock(string path)
    {
        using var source = new FileStream(new Microsoft.Win32.SafeHandles.SafeFileHandle(OpenForCopy(path), ownsHandle: true), FileAccess.Read);
        byte[] bytes = new byte[source.Length];
        RandomAccess.Read(source.SafeFileHandle, bytes, 0);
        return bytes;
    }

    [System.Runtime.InteropServices.DllImport("libc", EntryPoint = "open", SetLastError = true)]
    private static extern int LibcOpen([System.Runtime.InteropServices.MarshalAs(System.Runtime.InteropServices.UnmanagedType.LPUTF8Str)] string path, int flags);

    /// <summary>A hash of <paramref name="text"/> that is the same in every process (string.GetHashCode is randomized).</summary>
    private static int StableHash(string text)
    {
        int hash = 17;
        foreach (char ch in text)
        {
            hash = (hash * 31) + ch;
        }

        return hash;
    }

    private static int DefaultCases(string kind) => kind switch
    {
        "swap-descriptors" or "copy-descriptor" => 30,
        "truncate" or "extend" => 10,
        _ => 20,
    };

    /// <summary>What the image holds: the final contents and every value each key ever had durably.</summary>
    private sealed class Image
    {
        internal Dictionary<long, long> Map { get; } = new();

        internal Dictionary<long, HashSet<long>> MapHistory { get; } = new();

        internal Dictionary<long, byte[]> Bytes { get; } = new();

        internal Dictionary<long, HashSet<string>> BytesHistory { get; } = new();

        internal List<long> Queue { get; } = new();

        internal List<long> QueueHistory { get; } = new();

        internal long SegmentCount { get; set; }

        internal long DataStart { get; set; }
    }

    private static Image Build(string path)
    {
        var image = new Image();
        var random = new Random(Seed);
        var options = new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan };
        using (BufferedDurableHeap heap = BufferedDurableHeap.Create(path, new HeapFileOptions { Size = 2L << 20, MaxSize = 2L << 20, Domain = PersistenceDomainKind.MappedFile }, options))
        {
            var map = new PersistentHashMap<long, long>(heap, MapType);
            var bytes = new PersistentByteMap<long>(heap, BytesType);
            var queue = new PersistentQueue<long>(heap, QueueType);
            long next = 0;
            for (int round = 0; round < 6; round++)
            {
                // Each round moves the byte map's values to other size classes, so segments are released and reused.
                int baseSize = round % 2 == 0 ? 40 + (round * 30) : 300 + (round * 150);
                for (long k = 0; k < 80; k++)
                {
                    if (random.Next(5) == 0 && image.Bytes.Remove(k))
                    {
                        bytes.Remove(k);
                        continue;
                    }

                    byte[] value = new byte[baseSize + random.Next(baseSize / 2)];
                    random.NextBytes(value);
                    bytes.Set(k, value);
                    image.Bytes[k] = value;
                    Add(image.BytesHistory, k, Convert.ToBase64String(value));
                }

                for (long k = 1000; k < 1003; k++)
                {
                    // Large blocks (spans of segments), replaced every round with another span.
                    byte[] value = new byte[(16 << 10) + random.Next(100 << 10)];
                    random.NextBytes(value);
                    bytes.Set(k, value);
                    image.Bytes[k] = value;
                    Add(image.BytesHistory, k, Convert.ToBase64String(value));
                }

                for (long k = 0; k < 200; k++)
                {
                    if (random.Next(6) == 0 && image.Map.Remove(k))
                    {
                        map.Remove(k);
                        continue;
                    }

                    long v = random.NextInt64();
                    map.Set(k, v);
                    image.Map[k] = v;
                    Add(image.MapHistory, k, v);
                }

                for (int i = 0; i < 30; i++)
                {
                    queue.Enqueue(next);
                    image.Queue.Add(next);
                    image.QueueHistory.Add(next++);
                }

                for (int i = 0; i < 20 && queue.TryDequeue(out long d); i++)
                {
                    image.Queue.RemoveAt(0);
                }

                heap.Sync();
            }

            image.SegmentCount = heap.Heap.File.SegmentCount;
            image.DataStart = heap.Heap.File.DataStart;
        }

        return image;
    }

    private static void Add<T>(Dictionary<long, HashSet<T>> history, long key, T value)
    {
        if (!history.TryGetValue(key, out HashSet<T>? set))
        {
            history[key] = set = new HashSet<T>();
        }

        set.Add(value);
    }

    private static byte[] Corrupt(byte[] original, string kind, Random random, Image image, out string what)
    {
        byte[] data = (byte[])original.Clone();
        long heapEnd = image.DataStart + (image.SegmentCount * HeapLayout.SegmentSize);
        int pages = (int)(heapEnd / 4096);
        switch (kind)
        {
            case "garbage":
                {
                    int length = 8 + random.Next(505);
                    int at = random.Next((int)heapEnd - length);
                    random.NextBytes(data.AsSpan(at, length));
                    what = $"garbage [{at}, +{length})";
                    return data;
                }

            case "zero-page":
                {
                    int page = random.Next(pages);
                    data.AsSpan(page * 4096, 4096).Clear();
                    what = $"zero page {page}";
                    return data;
                }

            case "swap-pages":
                {
                    int a = random.Next(pages), b = random.Next(pages);
                    Swap(data, a * 4096L, b * 4096L, 4096);
                    what = $"swap pages {a} {b}";
                    return data;
                }

            case "swap-segments":
                {
                    long a = random.NextInt64(image.SegmentCount), b = random.NextInt64(image.SegmentCount);
                    Swap(data, image.DataStart + (a * HeapLayout.SegmentSize), image.DataStart + (b * HeapLayout.SegmentSize), HeapLayout.SegmentSize);
                    what = $"swap segments {a} {b}";
                    return data;
                }

            case "swap-descriptors":
                {
                    long a = random.NextInt64(image.SegmentCount), b = random.NextInt64(image.SegmentCount);
                    Swap(data, HeapLayout.SuperblockSize + (a * 8), HeapLayout.SuperblockSize + (b * 8), 8);
                    what = $"swap descriptors {a} {b} (0x{BitConverter.ToUInt64(original, HeapLayout.SuperblockSize + (int)(a * 8)):X16}, 0x{BitConverter.ToUInt64(original, HeapLayout.SuperblockSize + (int)(b * 8)):X16})";
                    return data;
                }

            case "copy-descriptor":
                {
                    long a = random.NextInt64(image.SegmentCount), b = random.NextInt64(image.SegmentCount);
                    Array.Copy(original, HeapLayout.SuperblockSize + (a * 8), data, HeapLayout.SuperblockSize + (b * 8), 8);
                    what = $"copy descriptor {a} over {b} (0x{BitConverter.ToUInt64(original, HeapLayout.SuperblockSize + (int)(a * 8)):X16} over 0x{BitConverter.ToUInt64(original, HeapLayout.SuperblockSize + (int)(b * 8)):X16})";
                    return data;
                }

            case "truncate":
                {
                    long length = random.NextInt64(heapEnd);
                    bool extend = random.Next(2) == 0;
                    byte[] cut = new byte[extend ? original.Length : length];
                    Array.Copy(original, cut, length);
                    what = $"truncate to {length}{(extend ? " and extend with zeros" : string.Empty)}";
                    return cut;
                }

            case "extend":
                {
                    int more = 1 + random.Next(3 * HeapLayout.SegmentSize);
                    byte[] longer = new byte[original.Length + more];
                    original.CopyTo(longer, 0);
                    if (random.Next(2) == 0)
                    {
                        random.NextBytes(longer.AsSpan(original.Length));
                    }

                    what = $"extend by {more}";
                    return longer;
                }

            case "ff-page":
                {
                    int page = random.Next(pages);
                    data.AsSpan(page * 4096, 4096).Fill(0xFF);
                    what = $"0xFF page {page}";
                    return data;
                }

            case "copy-page":
                {
                    // A misdirected write: page a's bytes also written over page b.
                    int a = random.Next(pages), b = random.Next(pages);
                    Array.Copy(original, a * 4096L, data, b * 4096L, 4096);
                    what = $"copy page {a} over {b}";
                    return data;
                }

            case "zero-run":
                {
                    int count = 2 + random.Next(31);
                    int page = random.Next(pages - count);
                    data.AsSpan(page * 4096, count * 4096).Clear();
                    what = $"zero pages [{page}, +{count})";
                    return data;
                }

            case "copy-run":
                {
                    int count = 2 + random.Next(15);
                    int a = random.Next(pages - count), b = random.Next(pages - count);
                    Array.Copy(original, a * 4096L, data, b * 4096L, count * 4096);
                    what = $"copy pages [{a}, +{count}) over [{b}, +{count})";
                    return data;
                }

            case "fuzz":
                {
                    int count = 1 + random.Next(64);
                    for (int i = 0; i < count; i++)
                    {
                        data[random.NextInt64(heapEnd)] = (byte)random.Next(256);
                    }

                    what = $"fuzz {count} bytes";
                    return data;
                }

            default:
                throw new ArgumentException($"unknown corruption kind {kind}");
        }
    }

    private static void Swap(byte[] data, long a, long b, int length)
    {
        byte[] t = data.AsSpan((int)a, length).ToArray();
        Array.Copy(data, b, data, a, length);
        t.CopyTo(data, b);
    }

    /// <summary>After a salvaging open was closed: null when the next open (no salvage) reports no damage and holds what the salvage kept; otherwise why not.</summary>
    private static string? SecondOpen(string path, Dictionary<long, long> map, Dictionary<long, byte[]> bytes, long[] queue)
    {
        using BufferedDurableHeap again = BufferedDurableHeap.Open(path, new HeapFileOptions { Domain = PersistenceDomainKind.MappedFile }, new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan });
        if (again.Recovery.DamagedBlocks.Count != 0 || again.Recovery.DamagedSweepLogOffsets.Count != 0)
        {
            return $"SILENT: the open after a salvage reports {again.Recovery.DamagedBlocks.Count} damaged blocks and {again.Recovery.DamagedSweepLogOffsets.Count} damaged places in the sweep log";
        }

        Dictionary<long, long> map2 = new PersistentHashMap<long, long>(again, MapType).ToDictionary();
        var bytes2 = new PersistentByteMap<long>(again, BytesType).ToList().ToDictionary(e => e.Key, e => e.Value);
        long[] queue2 = new PersistentQueue<long>(again, QueueType).ToArray();
        bool same = map2.Count == map.Count && map2.All(e => map.TryGetValue(e.Key, out long v) && v == e.Value)
            && bytes2.Count == bytes.Count && bytes2.All(e => bytes.TryGetValue(e.Key, out byte[]? v) && v.AsSpan().SequenceEqual(e.Value))
            && queue2.SequenceEqual(queue);
        return same ? null : $"SILENT: the open after a salvage differs from it: map {map2.Count}/{map.Count}, bytes {bytes2.Count}/{bytes.Count}, queue {queue2.Length}/{queue.Length}";
    }

    /// <summary>Opens the file and classifies the result: "refused", "exact", "salvaged" or "SILENT ..."/"UNEXPECTED ...".</summary>
    private static string Check(string path, Image image, bool salvage)
    {
        var options = new BufferedDurableHeapOptions { AdvancePeriod = Timeout.InfiniteTimeSpan, SalvageDamagedBlocks = salvage };
        try
        {
            using BufferedDurableHeap heap = BufferedDurableHeap.Open(path, new HeapFileOptions { Domain = PersistenceDomainKind.MappedFile }, options);
            // Damaged blocks, or damage to the sweep log (whose lost frees may bring back payloads deleted since: past
            // values, which the checks below allow, but never a loss: the blocks the log listed held no live entry).
            bool damageReported = heap.Recovery.DamagedBlocks.Count != 0 || heap.Recovery.DamagedSweepLogOffsets.Count != 0;
            var map = new PersistentHashMap<long, long>(heap, MapType);
            var bytes = new PersistentByteMap<long>(heap, BytesType);
            var queue = new PersistentQueue<long>(heap, QueueType);
            Dictionary<long, long> gotMap = map.ToDictionary();
            var gotBytes = bytes.ToList().ToDictionary(e => e.Key, e => e.Value);
            long[] gotQueue = queue.ToArray();
            bool exact = gotMap.Count == image.Map.Count && gotMap.All(e => image.Map.TryGetValue(e.Key, out long v) && v == e.Value)
                && gotBytes.Count == image.Bytes.Count && gotBytes.All(e => image.Bytes.TryGetValue(e.Key, out byte[]? v) && v.AsSpan().SequenceEqual(e.Value))
                && gotQueue.SequenceEqual(image.Queue);
            if (exact)
            {
                return "exact";
            }

            if (!damageReported)
            {
                return $"SILENT: opened without reporting damage, map {gotMap.Count}/{image.Map.Count}, bytes {gotBytes.Count}/{image.Bytes.Count}, queue {gotQueue.Length}/{image.Queue.Count}";
            }

            // Salvaged: whatever survived must be a value its key once had durably.
            foreach ((long k, long v) in gotMap)
            {
                if (!image.MapHistory.TryGetValue(k, out HashSet<long>? values) || !values.Contains(v))
                {
                    return $"SILENT: salvaged map key {k} holds {v}, a value it never had";
                }
            }

            foreach ((long k, byte[] v) in gotBytes)
            {
                if (!image.BytesHistory.TryGetValue(k, out HashSet<string>? values) || !values.Contains(Convert.ToBase64String(v)))
                {
                    return $"SILENT: salvaged byte-map key {k} holds {v.Length} bytes it never had";
                }
            }

            if (gotQueue.Any(e => !image.QueueHistory.Contains(e)) || gotQueue.Zip(gotQueue.Skip(1)).Any(p => p.First >= p.Second))
            {
                return "SILENT: salvaged queue holds elements never enqueued, or twice, or out of FIFO order";
            }

            // Each damaged block held one entry at most: a salvage loses or changes no more entries than it lists.
            int lost = image.Map.Count(e => !gotMap.TryGetValue(e.Key, out long v) || v != e.Value)
                + image.Bytes.Count(e => !gotBytes.TryGetValue(e.Key, out byte[]? v) || !v.AsSpan().SequenceEqual(e.Value))
                + image.Queue.Count(e => !gotQueue.Contains(e));
            if (lost > heap.Recovery.DamagedBlocks.Count)
            {
                return $"SILENT: the salvage lost or changed {lost} entries for {heap.Recovery.DamagedBlocks.Count} damaged blocks listed";
            }

            // The salvage leaves a sound file: the next open reports no damage and finds what this one kept.
            heap.Sync();
            heap.Dispose();
            try
            {
                return SecondOpen(path, gotMap, gotBytes, gotQueue) ?? "salvaged";
            }
            catch (Exception e)
            {
                return $"SILENT: the open after a salvage failed: {e.GetType().Name}: {e.Message.Split('\n')[0]}";
            }
        }
        catch (HeapFileException)
        {
            return "refused";
        }
        catch (InvalidDataException e)
        {
            if (salvage && Environment.GetEnvironmentVariable("EPVS_CORRUPTION_FUZZ_VERBOSE") is not null)
            {
                Console.WriteLine($"salvage refused by a structure: {e.Message}");
            }

            return "refused";
        }
        catch (Exception e)
        {
            return $"UNEXPECTED: {e.GetType().Name}: {e.Message.Split('\n')[0]}";
        }
    }
}
