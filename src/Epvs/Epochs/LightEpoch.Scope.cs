using System.Runtime.CompilerServices;

namespace Epvs;

public sealed unsafe partial class LightEpoch
{
    /// <summary>
    /// A protected region entered by <see cref="EnterScope"/>; <see cref="Dispose"/> leaves it. A ref struct,
    /// so it cannot escape the thread that entered, and it allocates nothing.
    /// </summary>
    public ref struct Scope
    {
        private LightEpoch? epoch;

        internal Scope(LightEpoch epoch) => this.epoch = epoch;

        /// <summary>
        /// Leaves the region. Clears the scope before leaving, so disposing twice, or disposing
        /// <c>default(Scope)</c>, does nothing.
        /// </summary>
        [MethodImpl(MethodImplOptions.AggressiveInlining)]
        public void Dispose()
        {
            LightEpoch? e = epoch;
            if (e is not null)
            {
                epoch = null;
                e.Suspend();
            }
        }
    }
}
