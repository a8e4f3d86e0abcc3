using System.Runtime.InteropServices;

namespace Epvs;

/// <summary>
/// A 64-bit value alone on its cache line. 128 bytes with the value in the middle keeps it off the
/// neighbours' lines whatever the alignment of the containing object, including on Arm64 and on x64
/// parts whose adjacent-line prefetcher pulls 128-byte pairs (same reasoning as dotnet/runtime's
/// <c>Internal.PaddingHelpers</c>).
/// </summary>
[StructLayout(LayoutKind.Explicit, Size = 128)]
internal struct PaddedInt64
{
    [FieldOffset(64)] public long Value;
}
