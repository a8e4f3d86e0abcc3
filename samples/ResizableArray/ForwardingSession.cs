namespace Epvs.Samples.ResizableArray;

/// <summary>The session of a variant that protects each operation by itself: forwards every call.</summary>
internal sealed class ForwardingSession : IResizableArraySession
{
    private readonly IResizableArray array;

    public ForwardingSession(IResizableArray array) => this.array = array;

    public long Read(int index) => array.Read(index);

    public void Write(int index, long value) => array.Write(index, value);

    public int Push(long value) => array.Push(value);

    public void Refresh()
    {
    }

    public void Dispose()
    {
    }
}
