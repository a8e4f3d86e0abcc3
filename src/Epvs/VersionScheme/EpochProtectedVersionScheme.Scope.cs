using System.Runtime.CompilerServices;

namespace Epvs;

public sealed partial class EpochProtectedVersionScheme
{
    /// <summary>
    /// A protected region entered by <see cref="EnterScope(out VersionSchemeState)"/>; <see cref="Dispose"/> leaves it. A ref struct, so it
    /// cannot escape the thread that entered, and it allocates nothing.
    /// </summary>
    public ref struct Scope
    {
        private EpochProtectedVersionScheme? scheme;

        internal Scope(EpochProtectedVersionScheme scheme) => this.scheme = scheme;

        /// <summary>
        /// Leaves the region. Clears the scope before leaving, so disposing twice, or disposing
        /// <c>default(Scope)</c>, does nothing.
        /// </summary>
        [MethodImpl(MethodImplOptions.AggressiveInlining)]
        public void Dispose()
        {
            EpochProtectedVersionScheme? s = scheme;
            if (s is not null)
            {
                scheme = null;
                s.Leave();
            }
        }
    }
}
