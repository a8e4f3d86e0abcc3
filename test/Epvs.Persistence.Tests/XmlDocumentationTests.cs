using System;
using System.IO;
using System.Linq;
using System.Xml.Linq;
using Xunit;

namespace Epvs.Persistence.Tests;

/// <summary>
/// The XML documentation the packages ship (a consumer's probe): every partial file of a type opened with a
/// <c>///</c> comment on the class, the compiler merged them, and IntelliSense showed the first — for
/// <see cref="BufferedDurableHeap"/>, an internal note about its advancer instead of what the type is.
/// </summary>
public sealed class XmlDocumentationTests
{
    [Theory]
    [InlineData("Epvs.xml")]
    [InlineData("Epvs.Persistence.xml")]
    public void EveryDocumentedMember_HasOneSummary(string file)
    {
        XDocument doc = XDocument.Load(Path.Combine(AppContext.BaseDirectory, file));
        string[] merged = doc.Descendants("member")
            .Where(m => m.Elements("summary").Count() > 1)
            .Select(m => $"{(string?)m.Attribute("name")}: {m.Elements("summary").Count()} summaries")
            .ToArray();
        Assert.True(merged.Length == 0, string.Join(Environment.NewLine, merged));
        Assert.Contains(doc.Descendants("member"), m => (string?)m.Attribute("name") == "T:Epvs.Persistence.BufferedDurableHeap" || (string?)m.Attribute("name") == "T:Epvs.LightEpoch");
    }
}
