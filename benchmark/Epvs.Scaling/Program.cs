using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.IO;
using System.Linq;
using System.Text;
using Epvs.Scaling.Arrays;
using Epvs.Scaling.Harness;
using Epvs.Scaling.Work;

// Thread-scaling harness for the EPVS paper's §6 figures.
//   dotnet run -c Release --project benchmark/Epvs.Scaling -- [--quick] [--figure 11,12,...] [--out DIR]
// Writes <fig>.csv, <fig>.svg and <fig>.md per figure, and summary.md, into benchmark/results (quick: results/quick).

var figures = new List<string>();
bool quick = false;
string? outDir = null;
for (int i = 0; i < args.Length; i++)
{
    switch (args[i])
    {
        case "--quick":
            quick = true;
            break;
        case "--figure" or "--figures" when i + 1 < args.Length:
            figures.AddRange(args[++i].Split(',', StringSplitOptions.RemoveEmptyEntries | StringSplitOptions.TrimEntries));
            break;
        case "--out" when i + 1 < args.Length:
            outDir = args[++i];
            break;
        case "--help" or "-h":
            Console.WriteLine("usage: Epvs.Scaling [--quick] [--figure 11,12,13,14,15,16,17,18,19,20,21|all] [--out DIR]");
            return 0;
        default:
            Console.Error.WriteLine($"unknown argument: {args[i]} (try --help)");
            return 2;
    }
}

string[] all = ["11", "12", "13", "14", "15", "16", "17", "18", "19", "20", "21"];
if (figures.Count == 0 || figures.Contains("all"))
    figures = all.ToList();

RunSettings settings = quick ? RunSettings.QuickSettings : RunSettings.Full;
outDir ??= Path.Combine(FindRepoRoot(), "benchmark", "results", quick ? "quick" : "");
Directory.CreateDirectory(outDir);
string machine = MachineInfo.Describe();
string command = "dotnet run -c Release --project benchmark/Epvs.Scaling --" + (args.Length > 0 ? " " + string.Join(' ', args) : "");
Console.WriteLine($"machine: {machine}");
Console.WriteLine($"settings: {settings.Repetitions} x {settings.Duration.TotalMilliseconds} ms per point, threads {string.Join(',', settings.Threads)}; output {outDir}");

var clock = Stopwatch.StartNew();
var summary = new StringBuilder();
foreach (string f in figures)
{
    IEnumerable<FigureResult> results = f switch
    {
        "11" => [ArrayFigures.Fig11(settings)],
        "12" => ArrayFigures.Fig12(settings).ToList(),
        "13" => [ArrayFigures.Fig13(settings)],
        "14" => [ArrayFigures.Fig14(settings)],
        "15" => [Epvs.Scaling.Kv.OwnershipFigure.Fig15(settings)],
        "16" => [Epvs.Scaling.Kv.CheckpointFigure.Fig16(settings)],
        "17" => [MicroFigures.Fig17(settings)],
        "18" => [MicroFigures.Fig18(settings)],
        "19" => [MicroFigures.Fig19(settings)],
        "20" => [MicroFigures.Fig20(settings)],
        "21" => [MicroFigures.Fig21(settings)],
        _ => throw new ArgumentException($"unknown figure {f}"),
    };
    foreach (FigureResult fig in results)
    {
        fig.Write(outDir);
        string md = fig.ToMarkdown(command, machine, settings);
        File.WriteAllText(Path.Combine(outDir, fig.Id + ".md"), md);
        summary.Append(md);
        foreach (string check in fig.Checks)
            Console.WriteLine($"  CHECK {check}");
    }
}
File.WriteAllText(Path.Combine(outDir, "summary.md"), all.All(figures.Contains) ? summary.ToString() : MergeSummary(Path.Combine(outDir, "summary.md"), summary.ToString()));
Console.WriteLine($"done in {clock.Elapsed.TotalSeconds:0} s; wrote {outDir}");
return 0;

// A run of some figures replaces their sections in an existing summary.md (or appends them) and keeps the others,
// so that `--figure 16` after a full run does not throw the full run's summary away.
static string MergeSummary(string path, string fresh)
{
    static List<(string Id, string Text)> Sections(string md)
    {
        var list = new List<(string Id, string Text)>();
        foreach (string part in md.Split("### ", StringSplitOptions.RemoveEmptyEntries))
        {
            int colon = part.IndexOf(':');
            list.Add((colon < 0 ? part : part[..colon], "### " + part));
        }
        return list;
    }
    if (!File.Exists(path))
        return fresh;
    var merged = Sections(File.ReadAllText(path));
    foreach ((string id, string text) in Sections(fresh))
    {
        int at = merged.FindIndex(s => s.Id == id);
        if (at >= 0)
            merged[at] = (id, text);
        else
            merged.Add((id, text));
    }
    static int Number(string id) => int.TryParse(new string(id.SkipWhile(c => !char.IsDigit(c)).TakeWhile(char.IsDigit).ToArray()), out int n) ? n : int.MaxValue;
    return string.Concat(merged.OrderBy(s => Number(s.Id)).Select(s => s.Text)); // stable: fig12's two parts keep their order
}

static string FindRepoRoot()
{
    for (string? dir = Directory.GetCurrentDirectory(); dir is not null; dir = Path.GetDirectoryName(dir))
    {
        if (File.Exists(Path.Combine(dir, "EPVS.sln")))
            return dir;
    }
    return Directory.GetCurrentDirectory();
}
