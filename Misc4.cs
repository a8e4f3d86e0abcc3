using Epvs.Persistence;

static partial class Misc
{
    static void Limits(string[] args)
    {
        var p = F("lim1");
        using (var h = BufferedDurableHeap.Create(p, new HeapFileOptions { Size = 1 << 20, MaxSize = 1 << 20 }))
        {
            var m = new PersistentHashMap<long, long>(h, 1);
            var items = Enumerable.Range(0, 200000).Select(i => new KeyValuePair<long, long>(i, i)).ToArray();
            int added = -1;
            T("SetMany fill", () => added = m.SetMany(items));
            Console.WriteLine($"added={added} count={m.Count}");
            long cnt = m.Count;
            var before = m.ToDictionary();
            // removes until reserve exhausted
            int removed = 0;
            T("Remove burst", () => { for (long i = 0; i < cnt; i++) { if (m.Remove(i)) removed++; } });
            Console.WriteLine($"removed={removed} count={m.Count}");
            long cnt2 = m.Count;
            T("Set existing when full", () => m.Set(cnt - 1, 777));
            m.TryGetValue(cnt - 1, out long v); Console.WriteLine($"value of last = {v}");
            var running = m.ToDictionary();
            h.Sync();
            T("reopen-compare (same process can't) ", () => { });
            File.WriteAllLines(p + ".expect", running.OrderBy(kv => kv.Key).Select(kv => $"{kv.Key} {kv.Value}"));
        }
        using (var h = BufferedDurableHeap.Open(p))
        {
            var m = new PersistentHashMap<long, long>(h, 1);
            var got = m.ToDictionary().OrderBy(kv => kv.Key).Select(kv => $"{kv.Key} {kv.Value}").ToArray();
            var exp = File.ReadAllLines(p + ".expect");
            Console.WriteLine($"reopen: count={got.Length} expected={exp.Length} equal={got.SequenceEqual(exp)} {h.Recovery}");
        }
    }

    static void Bytes(string[] args)
    {
        var p = F("bytes1");
        using (var h = BufferedDurableHeap.Create(p, new HeapFileOptions { Size = 1 << 20, MaxSize = 1 << 20 }))
        {
            var bm = new PersistentByteMap<long>(h, 1);
            int max = h.Heap.MaxPayloadSize;
            Console.WriteLine($"MaxPayloadSize={max}");
            T("set max-8", () => bm.Set(1, new byte[max - 8]));
            T("set max-7", () => bm.Set(2, new byte[max - 7]));
            T("set 2MB", () => bm.Set(3, new byte[2 << 20]));
            T("set 500K", () => bm.Set(4, new byte[500_000]));
            T("set 400K", () => bm.Set(5, new byte[400_000]));
            T("replace 5 with 300K", () => bm.Set(5, Enumerable.Repeat((byte)5, 300_000).ToArray()));
            T("replace 5 with 10", () => bm.Set(5, Enumerable.Repeat((byte)6, 10).ToArray()));
            var buf = new byte[4];
            T("TryCopyValue small dest", () => Console.Write($"rc={bm.TryCopyValue(5, buf)} buf0={buf[0]} "));
            T("TryCopyValue missing", () => Console.Write($"rc={bm.TryCopyValue(77, buf)} "));
            T("TryCopyValue empty dest", () => Console.Write($"rc={bm.TryCopyValue(5, Span<byte>.Empty)} "));
            // fill with many sizes
            int n = 0;
            T("fill sizes", () => { for (int i = 0; i < 100000; i++) { bm.Set(100 + i, new byte[(i * 37) % 3000]); n++; } });
            Console.WriteLine($"filled {n} count={bm.Count}");
            // replace an existing key with a much larger value when full
            var old = bm.Get(100 + 5);
            T("grow value when full", () => bm.Set(105, new byte[16000]));
            Console.WriteLine($"105 len now {bm.Get(105)?.Length} (was {old?.Length})");
            int rem = 0;
            T("remove all", () => { foreach (var kv in bm.ToList()) { if (bm.Remove(kv.Key)) rem++; } });
            Console.WriteLine($"removed {rem} count={bm.Count}");
            File.WriteAllLines(p + ".expect", bm.ToList().OrderBy(kv => kv.Key).Select(kv => $"{kv.Key} {Convert.ToHexString(System.Security.Cryptography.SHA1.HashData(kv.Value))}"));
        }
        using (var h = BufferedDurableHeap.Open(p))
        {
            var bm = new PersistentByteMap<long>(h, 1);
            var got = bm.ToList().OrderBy(kv => kv.Key).Select(kv => $"{kv.Key} {Convert.ToHexString(System.Security.Cryptography.SHA1.HashData(kv.Value))}").ToArray();
            var exp = File.ReadAllLines(p + ".expect");
            Console.WriteLine($"reopen: count={got.Length} expected={exp.Length} equal={got.SequenceEqual(exp)} {h.Recovery}");
        }
    }

    static void Huge(string[] args)
    {
        var p = F("huge1");
        using (var h = BufferedDurableHeap.Create(p, new HeapFileOptions { Size = 4 << 20, MaxSize = 8 << 20 }))
        {
            var m = new PersistentHashMap<Key4K, Big100K>(h, 1);
            var q = new PersistentQueue<Big100K>(h, 2);
            var m2 = new PersistentHashMap<Key40, long>(h, 3);
            T("huge set", () => { for (int i = 0; i < 100; i++) m.Set(new Key4K { A = i }, new Big100K { A = i * 3 }); });
            Console.WriteLine($"count={m.Count}");
            T("huge remove", () => { for (int i = 0; i < 10; i++) m.Remove(new Key4K { A = i }); });
            T("queue", () => { for (int i = 0; i < 100; i++) q.Enqueue(new Big100K { A = i }); });
            T("dequeue", () => { q.TryDequeue(out var x); Console.Write(x.A + " "); });
            T("m2", () => m2.Set(new Key40 { A = 5 }, 5));
            T("ToDictionary huge", () => m.ToDictionary());
            Console.WriteLine($"counts {m.Count} {q.Count} {m2.Count}");
            File.WriteAllText(p + ".expect", $"{m.Count} {q.Count} {m2.Count}");
        }
        T("reopen huge", () =>
        {
            using var h = BufferedDurableHeap.Open(p);
            var m = new PersistentHashMap<Key4K, Big100K>(h, 1);
            var q = new PersistentQueue<Big100K>(h, 2);
            var m2 = new PersistentHashMap<Key40, long>(h, 3);
            bool ok = true;
            for (int i = 10; i < m.Count + 10; i++) { if (!m.TryGetValue(new Key4K { A = i }, out var v) || v.A != i * 3) ok = false; }
            Console.Write($"counts {m.Count} {q.Count} {m2.Count} expect {File.ReadAllText(p + ".expect")} valuesok={ok} ");
        });
        T("reopen wrong key size 48", () => { using var h = BufferedDurableHeap.Open(p); new PersistentHashMap<Key48, long>(h, 3); });
        T("reopen wrong key size 4K as bytemap", () => { using var h = BufferedDurableHeap.Open(p); new PersistentByteMap<Key4K>(h, 1); });
        T("reopen queue as small queue", () => { using var h = BufferedDurableHeap.Open(p); new PersistentQueue<Big20K>(h, 2); });
    }
}
