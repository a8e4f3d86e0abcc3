using System;
using System.Collections.Concurrent;
using System.Collections.Generic;
using System.IO;
using System.Linq;
using System.Threading;
using System.Threading.Tasks;

namespace Epvs.Samples.CprCheckpoint;

/// <summary>
/// A key-value store with request de-duplication and CPR-style asynchronous checkpoints driven by EPVS (paper §2.1
/// "consistent snapshots", §5.2, Figs. 9–10). A request (client, sequence number, update) first checks and advances
/// the client's entry in the de-duplication vector, then updates the table, in one protected region. A checkpoint is
/// the state machine REST(v) → WAIT_FLUSH(v) → REST(v + 1): the critical section into WAIT_FLUSH fixes the cut (it
/// copies the de-duplication vector and freezes every record of version ≤ v); during WAIT_FLUSH requests
/// read-copy-update frozen records into version v + 1 while a background task writes the cut to a file; when the file
/// is complete the store returns to REST, where requests update records in place. Because the cut is taken while no
/// request is in flight, every request in a checkpoint's de-duplication vector is reflected in its table and vice
/// versa.
/// </summary>
public sealed class CprStore : IDisposable
{
    /// <summary>The phase in which a checkpoint is being written.</summary>
    public const byte WaitFlush = 1;

    private readonly EpochProtectedVersionScheme epvs = new();
    private readonly ConcurrentDictionary<long, RecordSlot> index = new();
    private readonly ConcurrentDictionary<long, ClientState> clients = new();
    private readonly CprStoreOptions options;
    private CheckpointStateMachine? lastCheckpointMachine;
    private long checkpointsCompleted;
    private long readCopyUpdates;

    /// <summary>Creates an empty store that writes its checkpoints to <paramref name="directory"/>.</summary>
    /// <param name="directory">The checkpoint directory; created if missing. It must hold no checkpoint (use
    /// <see cref="Recover"/> to continue from one).</param>
    /// <param name="options">Options, or null for the defaults.</param>
    /// <exception cref="InvalidOperationException">The directory already holds checkpoints.</exception>
    public CprStore(string directory, CprStoreOptions? options = null)
        : this(directory, options, recovering: false)
    {
    }

    private CprStore(string directory, CprStoreOptions? options, bool recovering)
    {
        ArgumentNullException.ThrowIfNull(directory);
        Directory.CreateDirectory(directory);
        CheckpointDirectory = directory;
        this.options = options ?? new CprStoreOptions();
        if (!recovering && ListCheckpoints(directory).Any())
            throw new InvalidOperationException($"'{directory}' already holds checkpoints: recover from them with CprStore.Recover, or use an empty directory (a new store would overwrite them).");
    }

    /// <summary>Where checkpoints are written.</summary>
    public string CheckpointDirectory { get; }

    /// <summary>The scheme; its version is the version of the next checkpoint.</summary>
    public EpochProtectedVersionScheme Scheme => epvs;

    /// <summary>Checkpoints completed by this instance.</summary>
    public long CheckpointsCompleted => Interlocked.Read(ref checkpointsCompleted);

    /// <summary>Updates that copied a frozen record (made while a checkpoint was being written).</summary>
    public long ReadCopyUpdates => Interlocked.Read(ref readCopyUpdates);

    /// <summary>The number of keys.</summary>
    public int KeyCount => index.Count;

    /// <summary>TEST-ONLY CONTROL: apply the update and record it in the de-duplication vector in two separate
    /// protected regions (yielding in between), so a checkpoint can cut between them. Breaks consistency on purpose,
    /// so that tests can show their checker catches it.</summary>
    internal bool BreakDedupAtomicityForTesting { get; set; }

    /// <summary>Fault injection for the crash demonstration: called by the flush task once about half of a
    /// checkpoint's records are in its temporary file (with the checkpoint version).</summary>
    internal Action<long>? FlushHalfWrittenHook { get; set; }

    /// <summary>
    /// Opens the session of client <paramref name="clientId"/>. A client has at most one open session; its
    /// de-duplication entry survives the session (and recovery).
    /// </summary>
    /// <param name="clientId">The client.</param>
    /// <returns>The session; use it from one thread at a time.</returns>
    /// <exception cref="InvalidOperationException">The client already has an open session.</exception>
    public CprSession OpenSession(long clientId)
    {
        ClientState client = clients.GetOrAdd(clientId, static id => new ClientState(id, 0));
        if (Interlocked.CompareExchange(ref client.InUse, 1, 0) != 0)
            throw new InvalidOperationException($"Client {clientId} already has an open session; dispose it first.");
        return new CprSession(this, client);
    }

    /// <summary>
    /// Starts a checkpoint and returns when it is complete (its file written, flushed and renamed). Requests keep
    /// running meanwhile. If another checkpoint is running, this one starts after it.
    /// </summary>
    /// <returns>The completed checkpoint.</returns>
    /// <exception cref="InvalidOperationException">The calling thread is inside a protected region of the store.</exception>
    /// <exception cref="IOException">The checkpoint file could not be written (the store is back at rest; the
    /// previous checkpoint remains the latest).</exception>
    public async Task<CheckpointInfo> TakeCheckpointAsync()
    {
        var machine = new CheckpointStateMachine(this);
        epvs.ExecuteStateMachine(machine); // waits only while another machine is active
        Volatile.Write(ref lastCheckpointMachine, machine); // release; Dispose waits for it
        await machine.Completion.ConfigureAwait(false);
        if (machine.FlushError is { } error)
            throw new IOException($"Checkpoint {machine.CheckpointVersion} could not be written to '{CheckpointDirectory}'.", error);
        return machine.Info!;
    }

    /// <summary>
    /// Recovers a store from the newest complete, intact checkpoint in <paramref name="directory"/>. Newer files that
    /// are corrupt, truncated or incomplete are skipped and listed in <paramref name="report"/>; the store continues at
    /// the recovered version + 1.
    /// </summary>
    /// <param name="directory">The checkpoint directory.</param>
    /// <param name="report">What was recovered and what was skipped.</param>
    /// <param name="options">Options, or null for the defaults.</param>
    /// <returns>The recovered store (empty if the directory holds no checkpoint file at all).</returns>
    /// <exception cref="CorruptCheckpointException">Checkpoint files exist but none is intact: recovering an empty
    /// store would silently lose their data. The message names the newest file and its defect.</exception>
    public static CprStore Recover(string directory, out RecoveryReport report, CprStoreOptions? options = null)
    {
        ArgumentNullException.ThrowIfNull(directory);
        var store = new CprStore(directory, options, recovering: true);
        var skipped = new List<SkippedCheckpoint>();
        CorruptCheckpointException? newestFailure = null;
        foreach ((string path, long version, bool complete) in ListCheckpoints(directory).OrderByDescending(c => c.Version).ThenBy(c => c.Complete))
        {
            if (!complete)
            {
                skipped.Add(new SkippedCheckpoint(path, "incomplete: the checkpoint was interrupted before its file was completed"));
                continue;
            }
            CheckpointSnapshot snapshot;
            try
            {
                snapshot = CheckpointFile.Read(path);
            }
            catch (CorruptCheckpointException ex)
            {
                newestFailure ??= ex;
                skipped.Add(new SkippedCheckpoint(path, ex.Reason));
                continue;
            }
            if (snapshot.Version != version)
            {
                newestFailure ??= new CorruptCheckpointException(path, $"it holds version {snapshot.Version}, not the {version} its name says");
                skipped.Add(new SkippedCheckpoint(path, newestFailure.Reason));
                continue;
            }

            store.Load(snapshot);
            report = new RecoveryReport(version, path, skipped, snapshot.ClientSequenceNumbers);
            return store;
        }

        if (newestFailure is not null)
        {
            store.Dispose();
            throw newestFailure;
        }
        report = new RecoveryReport(null, null, skipped, new Dictionary<long, long>());
        return store;
    }

    /// <summary>Waits (up to 30 s) for a checkpoint in progress, then disposes the scheme. No session may be in use.</summary>
    /// <exception cref="TimeoutException">The checkpoint in progress did not finish within 30 s.</exception>
    public void Dispose()
    {
        if (Volatile.Read(ref lastCheckpointMachine) is { } machine && !((IAsyncResult)machine.Completion).AsyncWaitHandle.WaitOne(TimeSpan.FromSeconds(30)))
            throw new TimeoutException("A checkpoint was still being written 30 s after Dispose was called.");
        epvs.Dispose();
    }

    internal RequestResult Apply(ClientState client, long sequenceNumber, long key, long argument, bool add)
    {
        if (BreakDedupAtomicityForTesting)
            return ApplyNonAtomicallyForTesting(client, sequenceNumber, key, argument, add);

        VersionSchemeState state = epvs.Enter();
        try
        {
            return ApplyProtected(client, sequenceNumber, key, argument, add, state);
        }
        finally
        {
            epvs.Leave();
        }
    }

    /// <summary>A request, inside a protected region (the caller's) that observed <paramref name="state"/>.</summary>
    internal RequestResult ApplyProtected(ClientState client, long sequenceNumber, long key, long argument, bool add, VersionSchemeState state)
    {
        // One client, one thread at a time: the check and the update of its entry need no atomic instruction.
        if (sequenceNumber <= client.LastSequenceNumber)
            return RequestResult.Duplicate;
        Update(key, argument, add, state);
        // Release: a checkpoint's critical section (after this region ends) reads it with the table.
        Volatile.Write(ref client.LastSequenceNumber, sequenceNumber);
        return RequestResult.Applied;
    }

    internal bool TryRead(long key, out long value)
    {
        epvs.Enter();
        try
        {
            return TryReadProtected(key, out value);
        }
        finally
        {
            epvs.Leave();
        }
    }

    /// <summary>A read, inside a protected region (the caller's).</summary>
    internal bool TryReadProtected(long key, out long value)
    {
        if (index.TryGetValue(key, out RecordSlot? slot) && Volatile.Read(ref slot.Head) is { } head)
        {
            value = Volatile.Read(ref head.Value); // acquire: pairs with in-place updates' interlocked/release writes
            return true;
        }
        value = 0;
        return false;
    }

    /// <summary>Applies an update inside a protected region that observed <paramref name="state"/>.</summary>
    private void Update(long key, long argument, bool add, VersionSchemeState state)
    {
        RecordSlot slot = index.GetOrAdd(key, static _ => new RecordSlot());
        bool flushing = state.Phase == WaitFlush;
        long version = state.Version;
        while (true)
        {
            Record? head = Volatile.Read(ref slot.Head); // acquire: pairs with the CAS that published it
            if (head is null)
            {
                // A new key belongs to the next checkpoint if the current one is already cut.
                var created = new Record(argument, flushing ? version + 1 : version, null);
                if (Interlocked.CompareExchange(ref slot.Head, created, null) is null)
                    return;
                continue;
            }

            if (!flushing || head.Version > version)
            {
                // In place: at rest every record is mutable; while flushing, those of the next version are.
                if (add)
                    Interlocked.Add(ref head.Value, argument);
                else
                    Volatile.Write(ref head.Value, argument);
                if (!flushing && head.Previous is not null)
                    head.Previous = null; // the flush that needed the frozen copy is over
                return;
            }

            // Read-copy-update: head is in the checkpoint being written, frozen until the flush is over.
            long frozen = Volatile.Read(ref head.Value);
            var copy = new Record(add ? frozen + argument : argument, version + 1, head);
            if (Interlocked.CompareExchange(ref slot.Head, copy, head) == head)
            {
                head.Previous = null; // the flusher needs head itself, never what head replaced
                Interlocked.Increment(ref readCopyUpdates);
                return;
            }
        }
    }

    /// <summary>The test-only control (see <see cref="BreakDedupAtomicityForTesting"/>).</summary>
    private RequestResult ApplyNonAtomicallyForTesting(ClientState client, long sequenceNumber, long key, long argument, bool add)
    {
        VersionSchemeState state = epvs.Enter();
        try
        {
            if (sequenceNumber <= client.LastSequenceNumber)
                return RequestResult.Duplicate;
            Update(key, argument, add, state);
        }
        finally
        {
            epvs.Leave();
        }
        Thread.Yield(); // widen the window for a checkpoint to cut between the update and its de-duplication entry
        epvs.Enter();
        try
        {
            Volatile.Write(ref client.LastSequenceNumber, sequenceNumber);
        }
        finally
        {
            epvs.Leave();
        }
        return RequestResult.Applied;
    }

    /// <summary>In the critical section REST(v) → WAIT_FLUSH(v): the de-duplication vector of the cut. No request
    /// is in flight, so it matches the table exactly.</summary>
    internal List<KeyValuePair<long, long>> CaptureClients()
    {
        var vector = new List<KeyValuePair<long, long>>(clients.Count);
        foreach (ClientState client in clients.Values)
            vector.Add(new KeyValuePair<long, long>(client.ClientId, Volatile.Read(ref client.LastSequenceNumber)));
        return vector;
    }

    /// <summary>On the flush task, during WAIT_FLUSH(<paramref name="version"/>): writes every key's newest record of
    /// version ≤ <paramref name="version"/> (frozen: no one updates them now) and completes the file.</summary>
    internal CheckpointInfo WriteCheckpoint(long version, List<KeyValuePair<long, long>> vector)
    {
        using var writer = new CheckpointFile.Writer(CheckpointDirectory, version, vector);
        int half = index.Count / 2;
        Action<long>? hook = FlushHalfWrittenHook;
        foreach (KeyValuePair<long, RecordSlot> entry in index)
        {
            Record? record = Volatile.Read(ref entry.Value.Head);
            while (record is not null && record.Version > version)
                record = record.Previous; // a read-copy-update since the cut: the frozen record is behind it
            if (record is null)
                continue; // a key created since the cut
            writer.AddRecord(entry.Key, Volatile.Read(ref record.Value));
            if (hook is not null && writer.Records >= half)
            {
                writer.FlushBuffer();
                hook(version);
                hook = null;
            }
        }
        if (hook is not null)
        {
            writer.FlushBuffer();
            hook(version); // an empty cut: still a half-written file
        }
        long bytes = writer.Complete(options.FlushToDisk);
        Interlocked.Increment(ref checkpointsCompleted);
        DeleteOldCheckpoints(version);
        return new CheckpointInfo(version, writer.FinalPath, vector.Count, writer.Records, bytes);
    }

    private void DeleteOldCheckpoints(long newest)
    {
        if (options.RetainedCheckpoints <= 0)
            return;
        foreach ((string path, long version, _) in ListCheckpoints(CheckpointDirectory))
        {
            if (version <= newest - options.RetainedCheckpoints)
                File.Delete(path);
        }
    }

    private void Load(CheckpointSnapshot snapshot)
    {
        foreach (KeyValuePair<long, long> record in snapshot.Records)
            index[record.Key] = new RecordSlot { Head = new Record(record.Value, snapshot.Version, null) };
        foreach (KeyValuePair<long, long> client in snapshot.ClientSequenceNumbers)
            clients[client.Key] = new ClientState(client.Key, client.Value);
        // Continue after the recovered checkpoint. No other thread knows this store yet.
        epvs.AdvanceVersionWithCriticalSection((_, _) => { }, snapshot.Version + 1, spin: true);
    }

    private static IEnumerable<(string Path, long Version, bool Complete)> ListCheckpoints(string directory)
    {
        foreach (string path in Directory.EnumerateFiles(directory, "checkpoint-*"))
        {
            if (CheckpointFile.VersionOf(path) is long version)
                yield return (path, version, !path.EndsWith(CheckpointFile.TemporaryExtension, StringComparison.Ordinal));
        }
    }
}
