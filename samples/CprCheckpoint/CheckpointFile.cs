using System;
using System.Buffers.Binary;
using System.Collections.Generic;
using System.Globalization;
using System.IO;
using System.Security.Cryptography;
using System.Text;

namespace Epvs.Samples.CprCheckpoint;

/// <summary>
/// The checkpoint file format and its reader. A checkpoint is written to <c>checkpoint-&lt;version&gt;.cpr.tmp</c>,
/// flushed, then renamed to <c>checkpoint-&lt;version&gt;.cpr</c>: a file with the final name was written completely.
/// </summary>
/// <remarks>
/// Layout (little-endian): magic "EPVSCPR1"; int32 format version (1); int64 checkpoint version; int32 client
/// count; client count × (int64 client id, int64 last sequence number); record count × (int64 key, int64 value);
/// trailer: magic "CPR1-END", int64 record count, 32-byte SHA-256 of every byte before the hash.
/// </remarks>
public static class CheckpointFile
{
    /// <summary>The extension of a completed checkpoint file.</summary>
    public const string Extension = ".cpr";

    /// <summary>The extension of a checkpoint being written.</summary>
    public const string TemporaryExtension = ".cpr.tmp";

    private const int FormatVersion = 1;
    private const int HeaderSize = 8 + 4 + 8 + 4;
    private const int TrailerSize = 8 + 8 + 32;
    private static readonly byte[] HeaderMagic = Encoding.ASCII.GetBytes("EPVSCPR1");
    private static readonly byte[] TrailerMagic = Encoding.ASCII.GetBytes("CPR1-END");

    /// <summary>The path of checkpoint <paramref name="version"/> in <paramref name="directory"/>.</summary>
    /// <param name="directory">The checkpoint directory.</param>
    /// <param name="version">The checkpoint version.</param>
    /// <returns>The path.</returns>
    public static string PathOf(string directory, long version) =>
        Path.Combine(directory, $"checkpoint-{version.ToString("D12", CultureInfo.InvariantCulture)}{Extension}");

    /// <summary>The version in a checkpoint file name, or null if the name is not one.</summary>
    /// <param name="path">A path.</param>
    /// <returns>The version, or null.</returns>
    public static long? VersionOf(string path)
    {
        string name = Path.GetFileName(path);
        if (!name.StartsWith("checkpoint-", StringComparison.Ordinal))
            return null;
        int end = name.EndsWith(TemporaryExtension, StringComparison.Ordinal) ? name.Length - TemporaryExtension.Length
            : name.EndsWith(Extension, StringComparison.Ordinal) ? name.Length - Extension.Length
            : -1;
        if (end < 0)
            return null;
        return long.TryParse(name.AsSpan("checkpoint-".Length, end - "checkpoint-".Length), NumberStyles.None, CultureInfo.InvariantCulture, out long version)
            ? version
            : null;
    }

    /// <summary>
    /// Reads and verifies a checkpoint file.
    /// </summary>
    /// <param name="path">The file.</param>
    /// <returns>Its content.</returns>
    /// <exception cref="CorruptCheckpointException">The file is not a checkpoint, is truncated, or fails its
    /// checksum; the message says which.</exception>
    /// <exception cref="IOException">The file cannot be read.</exception>
    public static CheckpointSnapshot Read(string path)
    {
        byte[] bytes = File.ReadAllBytes(path);
        if (bytes.Length < HeaderMagic.Length || !bytes.AsSpan(0, HeaderMagic.Length).SequenceEqual(HeaderMagic))
            throw new CorruptCheckpointException(path, bytes.Length < HeaderMagic.Length ? $"truncated ({bytes.Length} bytes, shorter than the header)" : "bad magic: not an EPVS CPR checkpoint file");
        if (bytes.Length < HeaderSize + TrailerSize)
            throw new CorruptCheckpointException(path, $"truncated ({bytes.Length} bytes, shorter than header and trailer)");
        ReadOnlySpan<byte> span = bytes;
        int format = BinaryPrimitives.ReadInt32LittleEndian(span[8..]);
        if (format != FormatVersion)
            throw new CorruptCheckpointException(path, $"unsupported format version {format} (this reader knows {FormatVersion})");
        long version = BinaryPrimitives.ReadInt64LittleEndian(span[12..]);
        int clients = BinaryPrimitives.ReadInt32LittleEndian(span[20..]);

        ReadOnlySpan<byte> trailer = span[^TrailerSize..];
        if (!trailer[..8].SequenceEqual(TrailerMagic))
            throw new CorruptCheckpointException(path, $"truncated or damaged: no trailer at the end of its {bytes.Length} bytes");
        long records = BinaryPrimitives.ReadInt64LittleEndian(trailer[8..]);
        long expectedLength = clients < 0 || records < 0 ? -1 : HeaderSize + 16L * clients + 16L * records + TrailerSize;
        if (expectedLength != bytes.Length)
            throw new CorruptCheckpointException(path, $"damaged: its header and trailer announce {clients} clients and {records} records ({expectedLength} bytes) but it has {bytes.Length} bytes");
        byte[] hash = SHA256.HashData(span[..^32]);
        if (!trailer[^32..].SequenceEqual(hash))
            throw new CorruptCheckpointException(path, "checksum mismatch: the content was damaged after it was written");

        var sequenceNumbers = new Dictionary<long, long>(clients);
        int offset = HeaderSize;
        for (int i = 0; i < clients; i++, offset += 16)
            sequenceNumbers[BinaryPrimitives.ReadInt64LittleEndian(span[offset..])] = BinaryPrimitives.ReadInt64LittleEndian(span[(offset + 8)..]);
        var table = new Dictionary<long, long>((int)Math.Min(records, int.MaxValue));
        for (long i = 0; i < records; i++, offset += 16)
            table[BinaryPrimitives.ReadInt64LittleEndian(span[offset..])] = BinaryPrimitives.ReadInt64LittleEndian(span[(offset + 8)..]);
        return new CheckpointSnapshot(version, sequenceNumbers, table);
    }

    /// <summary>Writes a checkpoint to its temporary file; <see cref="Complete"/> makes it final.</summary>
    internal sealed class Writer : IDisposable
    {
        private readonly FileStream stream;
        private readonly IncrementalHash hash = IncrementalHash.CreateHash(HashAlgorithmName.SHA256);
        private readonly byte[] buffer = new byte[64 * 1024];
        private int used;
        private long records;

        public Writer(string directory, long version, IReadOnlyList<KeyValuePair<long, long>> clients)
        {
            FinalPath = PathOf(directory, version);
            TemporaryPath = FinalPath[..^Extension.Length] + TemporaryExtension;
            stream = new FileStream(TemporaryPath, FileMode.Create, FileAccess.Write, FileShare.None, 1, FileOptions.None);
            Append(HeaderMagic);
            Span<byte> header = stackalloc byte[16];
            BinaryPrimitives.WriteInt32LittleEndian(header, FormatVersion);
            BinaryPrimitives.WriteInt64LittleEndian(header[4..], version);
            BinaryPrimitives.WriteInt32LittleEndian(header[12..], clients.Count);
            Append(header);
            foreach (KeyValuePair<long, long> client in clients)
                AppendPair(client.Key, client.Value);
        }

        public string FinalPath { get; }

        public string TemporaryPath { get; }

        public long Records => records;

        public void AddRecord(long key, long value)
        {
            AppendPair(key, value);
            records++;
        }

        /// <summary>Writes what is buffered to the temporary file (without the trailer).</summary>
        public void FlushBuffer()
        {
            stream.Write(buffer, 0, used);
            used = 0;
        }

        /// <summary>Writes the trailer, flushes (to disk if asked) and renames the file to its final name.</summary>
        public long Complete(bool flushToDisk)
        {
            Append(TrailerMagic);
            Span<byte> count = stackalloc byte[8];
            BinaryPrimitives.WriteInt64LittleEndian(count, records);
            Append(count);
            FlushBuffer();
            byte[] digest = hash.GetHashAndReset();
            stream.Write(digest);
            stream.Flush(flushToDisk);
            long length = stream.Length;
            stream.Dispose();
            File.Move(TemporaryPath, FinalPath, overwrite: true);
            return length;
        }

        public void Dispose()
        {
            stream.Dispose();
            hash.Dispose();
        }

        private void AppendPair(long first, long second)
        {
            Span<byte> pair = stackalloc byte[16];
            BinaryPrimitives.WriteInt64LittleEndian(pair, first);
            BinaryPrimitives.WriteInt64LittleEndian(pair[8..], second);
            Append(pair);
        }

        private void Append(ReadOnlySpan<byte> bytes)
        {
            hash.AppendData(bytes);
            if (used + bytes.Length > buffer.Length)
                FlushBuffer();
            bytes.CopyTo(buffer.AsSpan(used));
            used += bytes.Length;
        }
    }
}
