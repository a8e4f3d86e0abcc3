using System;
using System.Diagnostics;
using System.IO;
using System.IO.Compression;
using System.Linq;
using Xunit;

namespace Epvs.Tests;

/// <summary>
/// Packs the Epvs package from a copy of the sources into a local folder feed, then restores it into a fresh
/// consumer project and runs it, as a NuGet user would.
/// </summary>
public class PackageConsumptionTests
{
    private readonly ITestOutputHelper output;

    public PackageConsumptionTests(ITestOutputHelper output) => this.output = output;

    [Fact]
    public void Pack_ThenRestoreFromLocalFeed_ConsumerBuildsAndRuns()
    {
        string root = FindRepositoryRoot();
        string work = Path.Combine(Path.GetTempPath(), "epvs-package-test-" + Guid.NewGuid().ToString("N"));
        try
        {
            // Pack from a copy so this never races a build of the working tree.
            string copy = Path.Combine(work, "repo");
            foreach (string file in new[] { "Directory.Build.props", "Directory.Packages.props", "global.json", "README.md", "LICENSE", "CHANGELOG.md", ".editorconfig" })
                CopyInto(Path.Combine(root, file), Path.Combine(copy, file));
            foreach (string file in Directory.EnumerateFiles(Path.Combine(root, "src", "Epvs"), "*", SearchOption.AllDirectories)
                         .Where(f => f.EndsWith(".cs", StringComparison.Ordinal) || f.EndsWith(".csproj", StringComparison.Ordinal) ||
                                     Path.GetFileName(f).StartsWith("PublicAPI.", StringComparison.Ordinal))
                         .Where(f => !f.Contains($"{Path.DirectorySeparatorChar}obj{Path.DirectorySeparatorChar}") &&
                                     !f.Contains($"{Path.DirectorySeparatorChar}bin{Path.DirectorySeparatorChar}")))
                CopyInto(file, Path.Combine(copy, Path.GetRelativePath(root, file)));

            string feed = Path.Combine(work, "feed");
            Run("dotnet", $"pack \"{Path.Combine(copy, "src", "Epvs", "Epvs.csproj")}\" -c Release -o \"{feed}\"", copy);

            string package = Assert.Single(Directory.GetFiles(feed, "Epvs.*.nupkg"), f => !f.EndsWith(".snupkg", StringComparison.Ordinal));
            Assert.Single(Directory.GetFiles(feed, "Epvs.*.snupkg"));
            using (ZipArchive zip = ZipFile.OpenRead(package))
            {
                string[] entries = zip.Entries.Select(e => e.FullName).ToArray();
                foreach (string tfm in new[] { "net10.0", "net8.0", "netstandard2.1" })
                {
                    Assert.Contains($"lib/{tfm}/Epvs.dll", entries);
                    Assert.Contains($"lib/{tfm}/Epvs.xml", entries);
                }
                Assert.Contains("README.md", entries);
                Assert.Contains("LICENSE", entries);
                Assert.Contains("CHANGELOG.md", entries);

                // The license names MIT and credits FASTER's design; the metadata points at the repository and the notes.
                string license = ReadEntry(zip, "LICENSE");
                Assert.StartsWith("MIT License", license, StringComparison.Ordinal);
                Assert.Contains("Microsoft FASTER", license, StringComparison.Ordinal);
                var nuspec = System.Xml.Linq.XDocument.Parse(ReadEntry(zip, "Epvs.nuspec"));
                System.Xml.Linq.XNamespace ns = nuspec.Root!.Name.Namespace;
                System.Xml.Linq.XElement metadata = nuspec.Root.Element(ns + "metadata")!;
                System.Xml.Linq.XElement? repository = metadata.Element(ns + "repository");
                Assert.NotNull(repository);
                Assert.Equal("git", (string?)repository!.Attribute("type"));
                Assert.StartsWith("https://github.com/", (string?)repository.Attribute("url"), StringComparison.Ordinal);
                Assert.Equal((string?)repository.Attribute("url"), (string?)metadata.Element(ns + "projectUrl"));
                Assert.Equal("MIT", (string?)metadata.Element(ns + "license"));
                Assert.Equal("README.md", (string?)metadata.Element(ns + "readme"));
                Assert.Contains("CHANGELOG.md", (string?)metadata.Element(ns + "releaseNotes"), StringComparison.Ordinal);
                Assert.Contains("epoch-protection", (string?)metadata.Element(ns + "tags"), StringComparison.Ordinal);

                // The netstandard2.1 asset asks for the oldest Unsafe line it needs, so a consumer that pins an older one
                // than the newest restores (it asked for 6.1.2).
                System.Xml.Linq.XElement standard = metadata.Element(ns + "dependencies")!.Elements(ns + "group")
                    .Single(g => (string?)g.Attribute("targetFramework") == ".NETStandard2.1");
                Assert.Equal("4.5.3", (string?)standard.Elements(ns + "dependency").Single(d => (string?)d.Attribute("id") == "System.Runtime.CompilerServices.Unsafe").Attribute("version"));

                // The README is read on nuget.org, where a link relative to the repository leads nowhere.
                string readme = ReadEntry(zip, "README.md");
                string[] relative = System.Text.RegularExpressions.Regex.Matches(readme, @"\]\(([^)#][^)]*)\)")
                    .Select(m => m.Groups[1].Value).Where(link => !link.StartsWith("http", StringComparison.Ordinal)).ToArray();
                Assert.True(relative.Length == 0, "relative links in the package's README: " + string.Join(", ", relative));
            }
            string version = Path.GetFileNameWithoutExtension(package).Substring("Epvs.".Length);

            string consumer = Path.Combine(work, "consumer");
            Directory.CreateDirectory(consumer);
            File.WriteAllText(Path.Combine(consumer, "nuget.config"), $"""
                <?xml version="1.0" encoding="utf-8"?>
                <configuration>
                  <config><add key="globalPackagesFolder" value="{Path.Combine(work, "packages")}" /></config>
                  <packageSources><add key="local" value="{feed}" /></packageSources>
                </configuration>
                """);
            File.WriteAllText(Path.Combine(consumer, "Consumer.csproj"), $"""
                <Project Sdk="Microsoft.NET.Sdk">
                  <PropertyGroup>
                    <OutputType>Exe</OutputType>
                    <TargetFramework>net10.0</TargetFramework>
                    <Nullable>enable</Nullable>
                    <ImplicitUsings>enable</ImplicitUsings>
                  </PropertyGroup>
                  <ItemGroup><PackageReference Include="Epvs" Version="{version}" /></ItemGroup>
                </Project>
                """);
            File.WriteAllText(Path.Combine(consumer, "Program.cs"), """
                using Epvs;
                using var epvs = new EpochProtectedVersionScheme();
                long seen = 0;
                using (epvs.EnterScope(out VersionSchemeState state))
                    seen = state.Version;
                epvs.AdvanceVersionWithCriticalSection((from, to) => Console.WriteLine($"critical section {from}->{to}"), spin: true);
                Console.WriteLine($"consumer ok: {seen} -> {epvs.CurrentState.Version}");
                """);
            string stdout = Run("dotnet", "run -c Release", consumer);
            Assert.Contains("critical section 1->2", stdout);
            Assert.Contains("consumer ok: 1 -> 2", stdout);
        }
        finally
        {
            try
            {
                Directory.Delete(work, recursive: true);
            }
            catch (IOException)
            {
            }
        }
    }

    private static string ReadEntry(ZipArchive zip, string name)
    {
        using var reader = new StreamReader(zip.GetEntry(name)!.Open());
        return reader.ReadToEnd();
    }

    private static void CopyInto(string from, string to)
    {
        Directory.CreateDirectory(Path.GetDirectoryName(to)!);
        File.Copy(from, to);
    }

    private string Run(string fileName, string arguments, string workingDirectory)
    {
        var psi = new ProcessStartInfo(fileName, arguments)
        {
            WorkingDirectory = workingDirectory,
            RedirectStandardOutput = true,
            RedirectStandardError = true,
        };
        psi.Environment["DOTNET_CLI_TELEMETRY_OPTOUT"] = "1";
        psi.Environment["DOTNET_NOLOGO"] = "1";
        using Process process = Process.Start(psi)!;
        var stderr = process.StandardError.ReadToEndAsync();
        string stdout = process.StandardOutput.ReadToEnd();
        Assert.True(process.WaitForExit(300_000), $"{fileName} {arguments} did not finish in 5 minutes");
        output.WriteLine($"$ {fileName} {arguments}\n{stdout}{stderr.Result}");
        Assert.True(process.ExitCode == 0, $"{fileName} {arguments} exited with {process.ExitCode}:\n{stdout}\n{stderr.Result}");
        return stdout;
    }

    private static string FindRepositoryRoot()
    {
        for (string? dir = AppContext.BaseDirectory; dir is not null; dir = Path.GetDirectoryName(dir))
        {
            if (File.Exists(Path.Combine(dir, "EPVS.sln")))
                return dir;
        }
        throw new InvalidOperationException("EPVS.sln not found above the test assembly.");
    }
}
