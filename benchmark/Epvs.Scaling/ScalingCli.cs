using System;
using System.Collections.Generic;
using System.CommandLine;
using System.CommandLine.Parsing;
using System.Diagnostics;
using System.Globalization;
using System.IO;
using System.Linq;
using System.Text;
using Epvs.Scaling.Arrays;
using Epvs.Scaling.Harness;
using Epvs.Scaling.Kv;
using Epvs.Scaling.Work;

namespace Epvs.Scaling;

/// <summary>
/// The command line of the thread-scaling harness: measure figures (the root command) or draw them again from their
/// CSV files (<c>plot</c>). Exit codes: 0 done, 1 failed while running, 2 bad command line.
/// </summary>
public static class ScalingCli
{
    /// <summary>Exit code for a command line that does not parse or validate.</summary>
    public const int BadInput = 2;

    /// <summary>The figure numbers the harness knows (the paper's §6 figures).</summary>
    public static IReadOnlyList<string> AllFigures { get; } = ["11", "12", "13", "14", "15", "16", "17", "18", "19", "20", "21"];

    /// <summary>Parses <paramref name="args"/> and runs the command, writing to the given writers.</summary>
    /// <param name="args">The command line.</param>
    /// <param name="output">Progress and results (the per-point lines of a measurement still go to the console).</param>
    /// <param name="error">Errors.</param>
    /// <param name="measure">Measures the validated figures with the settings into the directory and returns the exit
    /// code; the default runs them. Tests replace it to see what would run.</param>
    public static int Run(string[] args, TextWriter output, TextWriter error, Func<IReadOnlyList<string>, RunSettings, string, int>? measure = null)
    {
        measure ??= (figures, settings, dir) => Measure(figures, settings, dir, args, output);
        RootCommand root = Build(output, error, measure);
        ParseResult parsed = root.Parse(args);
        // System.CommandLine's own error action exits with 1; a bad command line is 2 here, as for the other tools.
        if (Epvs.Samples.SampleCli.ReportErrors(parsed, error))
            return BadInput;
        return parsed.Invoke(new InvocationConfiguration { Output = output, Error = error });
    }

    private static RootCommand Build(TextWriter output, TextWriter error, Func<IReadOnlyList<string>, RunSettings, string, int> measure)
    {
        var figures = FigureOption();
        var quick = new Option<bool>("--quick") { Description = "Smoke run: one 60 ms run per point, smaller arrays; output into results/quick/ (< 1 minute)." };
        var outDir = new Option<string?>("--out") { Description = "Output directory (default: benchmark/results, or benchmark/results/quick with --quick).", HelpName = "DIR" };
        var threads = new Option<int[]?>("--threads")
        {
            Description = $"Thread counts of the scaling figures, comma-separated, each 1 to {MaxThreads} (default 1,2,4,8).",
            HelpName = "N,N,...",
            CustomParser = ParseThreads,
        };
        var duration = new Option<int?>("--duration")
        {
            Description = $"Measured milliseconds per run, 1 to {MaxDurationMs} (default 500, 60 with --quick).",
            HelpName = "MS",
            CustomParser = r => ParseInt(r, "--duration", 1, MaxDurationMs),
        };
        var repetitions = new Option<int?>("--repetitions")
        {
            Description = "Runs per point; the median is reported, 1 to 100 (default 3, 1 with --quick).",
            HelpName = "N",
            CustomParser = r => ParseInt(r, "--repetitions", 1, 100),
        };

        var root = new RootCommand(
            "Thread-scaling harness for the EPVS paper's section 6 figures (11-21). Measures each figure and writes " +
            "<fig>.csv (every repetition), <fig>.png (plot) and <fig>.md (table) plus summary.md.")
        {
            figures, quick, outDir, threads, duration, repetitions,
        };
        root.SetAction(parse =>
        {
            RunSettings settings = parse.GetValue(quick) ? RunSettings.QuickSettings : RunSettings.Full;
            // An option that is absent parses to an empty array, not null.
            if (parse.GetValue(threads) is { Length: > 0 } t)
                settings = settings with { Threads = t };
            if (parse.GetValue(duration) is int ms)
                settings = settings with { Duration = TimeSpan.FromMilliseconds(ms) };
            if (parse.GetValue(repetitions) is int reps)
                settings = settings with { Repetitions = reps };
            string dir = parse.GetValue(outDir) ?? Path.Combine(FindRepoRoot(), "benchmark", "results", settings.Quick ? "quick" : "");
            return measure(Selected(parse.GetValue(figures)), settings, dir);
        });

        var plotFigures = FigureOption();
        var plotDir = new Option<string?>("--dir") { Description = "Directory holding the <fig>.csv and <fig>.md files (default: benchmark/results).", HelpName = "DIR" };
        var format = new Option<string>("--format") { Description = "Image format to write next to each CSV file (SVG draws dashed lines solid: SkiaSharp's SVG backend has no dash effect).", DefaultValueFactory = _ => "png" };
        format.AcceptOnlyFromAmong("svg", "png");
        var plot = new Command("plot", "Draw the figures again from their CSV files (title and axis label from <fig>.md), without measuring.")
        {
            plotFigures, plotDir, format,
        };
        plot.SetAction(parse => Replot(
            parse.GetValue(plotDir) ?? Path.Combine(FindRepoRoot(), "benchmark", "results"),
            Selected(parse.GetValue(plotFigures)),
            parse.GetValue(format)!,
            output,
            error));
        root.Subcommands.Add(plot);
        return root;
    }

    private const int MaxThreads = 1024;
    private const int MaxDurationMs = 600_000;

    private static Option<string[]?> FigureOption()
    {
        var option = new Option<string[]?>("--figure", "--figures", "-f")
        {
            Description = "Figures to run, comma-separated or repeated: 11 to 21, or all (default all).",
            HelpName = "N,N,...|all",
            AllowMultipleArgumentsPerToken = false,
            CustomParser = ParseFigures,
        };
        return option;
    }

    // An option given no value parses to an empty array, not null: both mean every figure.
    private static IReadOnlyList<string> Selected(string[]? figures) => figures is { Length: > 0 } ? figures : AllFigures;

    private static string[]? ParseFigures(ArgumentResult result)
    {
        var list = new List<string>();
        foreach (Token token in result.Tokens)
        {
            foreach (string part in token.Value.Split(',', StringSplitOptions.RemoveEmptyEntries | StringSplitOptions.TrimEntries))
            {
                if (part.Equals("all", StringComparison.OrdinalIgnoreCase))
                {
                    list.AddRange(AllFigures);
                    continue;
                }
                if (!AllFigures.Contains(part))
                {
                    result.AddError($"unknown figure '{part}': the harness has figures {AllFigures[0]} to {AllFigures[^1]} (or all)");
                    return null;
                }
                list.Add(part);
            }
        }
        if (list.Count == 0)
        {
            result.AddError("--figure needs at least one figure number");
            return null;
        }
        return list.Distinct().ToArray();
    }

    private static int[]? ParseThreads(ArgumentResult result)
    {
        var list = new List<int>();
        foreach (Token token in result.Tokens)
        {
            foreach (string part in token.Value.Split(',', StringSplitOptions.RemoveEmptyEntries | StringSplitOptions.TrimEntries))
            {
                if (!int.TryParse(part, NumberStyles.Integer, CultureInfo.InvariantCulture, out int t) || t < 1 || t > MaxThreads)
                {
                    result.AddError($"--threads: '{part}' is not a thread count from 1 to {MaxThreads}");
                    return null;
                }
                list.Add(t);
            }
        }
        if (list.Count == 0)
        {
            result.AddError("--threads needs at least one thread count");
            return null;
        }
        return list.Distinct().Order().ToArray();
    }

    // A parser rather than a validator: a validator that reads the value throws on text that is not a number.
    private static int? ParseInt(ArgumentResult result, string name, int min, int max)
    {
        string text = result.Tokens.Count == 1 ? result.Tokens[0].Value : "";
        if (!int.TryParse(text, NumberStyles.Integer, CultureInfo.InvariantCulture, out int v))
        {
            result.AddError($"{name}: '{text}' is not a whole number");
            return null;
        }
        if (v < min || v > max)
        {
            result.AddError($"{name}: {v} is outside {min} to {max}");
            return null;
        }
        return v;
    }

    private static int Measure(IReadOnlyList<string> figures, RunSettings settings, string outDir, string[] args, TextWriter output)
    {
        Directory.CreateDirectory(outDir);
        string machine = MachineInfo.Describe();
        string command = "dotnet run -c Release --project benchmark/Epvs.Scaling --" + (args.Length > 0 ? " " + string.Join(' ', args) : "");
        output.WriteLine($"machine: {machine}");
        output.WriteLine($"settings: {settings.Repetitions} x {settings.Duration.TotalMilliseconds} ms per point, threads {string.Join(',', settings.Threads)}; output {outDir}");

        var clock = Stopwatch.StartNew();
        var summary = new StringBuilder();
        for (int i = 0; i < figures.Count; i++)
        {
            string f = figures[i];
            output.WriteLine($"figure {f} ({i + 1} of {figures.Count}), {clock.Elapsed.TotalSeconds:0} s so far");
            IEnumerable<FigureResult> results = f switch
            {
                "11" => [ArrayFigures.Fig11(settings)],
                "12" => ArrayFigures.Fig12(settings).ToList(),
                "13" => [ArrayFigures.Fig13(settings)],
                "14" => [ArrayFigures.Fig14(settings)],
                "15" => [OwnershipFigure.Fig15(settings)],
                "16" => [CheckpointFigure.Fig16(settings)],
                "17" => [MicroFigures.Fig17(settings)],
                "18" => [MicroFigures.Fig18(settings)],
                "19" => [MicroFigures.Fig19(settings)],
                "20" => [MicroFigures.Fig20(settings)],
                "21" => [MicroFigures.Fig21(settings)],
                _ => throw new UnreachableException($"figure {f} passed validation"),
            };
            foreach (FigureResult fig in results)
            {
                fig.Write(outDir);
                string md = fig.ToMarkdown(command, machine, settings);
                File.WriteAllText(Path.Combine(outDir, fig.Id + ".md"), md);
                summary.Append(md);
                foreach (string check in fig.Checks)
                    output.WriteLine($"  CHECK {check}");
            }
        }
        string summaryPath = Path.Combine(outDir, "summary.md");
        File.WriteAllText(summaryPath, AllFigures.All(figures.Contains) ? summary.ToString() : MergeSummary(summaryPath, summary.ToString()));
        output.WriteLine($"done in {clock.Elapsed.TotalSeconds:0} s; wrote {outDir}");
        return 0;
    }

    /// <summary>Draws every selected figure's CSV file in <paramref name="dir"/> again; returns the exit code.</summary>
    private static int Replot(string dir, IReadOnlyList<string> figures, string format, TextWriter output, TextWriter error)
    {
        if (!Directory.Exists(dir))
        {
            error.WriteLine($"error: no directory {dir}");
            return BadInput;
        }
        // fig12 is two files (fig12-push10, fig12-push50): select by the number after "fig".
        var csvs = Directory.GetFiles(dir, "fig*.csv")
            .Where(p => figures.Contains(FigureNumber(Path.GetFileNameWithoutExtension(p))))
            .Order(StringComparer.Ordinal)
            .ToList();
        if (csvs.Count == 0)
        {
            error.WriteLine($"error: no fig<N>.csv files for figure(s) {string.Join(',', figures)} in {dir}");
            return BadInput;
        }
        foreach (string csv in csvs)
        {
            string id = Path.GetFileNameWithoutExtension(csv);
            (string title, string xLabel) = ReadLabels(Path.ChangeExtension(csv, ".md"), id);
            FigureResult fig = FigureResult.ReadCsv(csv, title, xLabel);
            string image = Path.ChangeExtension(csv, "." + format);
            FigurePlot.Save(fig, image);
            output.WriteLine($"{id}: {fig.Series.Count} series x {fig.XValues.Count} points -> {image}");
        }
        return 0;
    }

    private static string FigureNumber(string id) =>
        new(id.SkipWhile(c => !char.IsDigit(c)).TakeWhile(char.IsDigit).ToArray());

    /// <summary>The title ("### figNN: title") and x label (first header cell of the table) of a figure's Markdown.</summary>
    internal static (string Title, string XLabel) ReadLabels(string mdPath, string id)
    {
        string title = id, xLabel = "threads";
        if (!File.Exists(mdPath))
            return (title, xLabel);
        bool haveX = false;
        foreach (string line in File.ReadLines(mdPath))
        {
            if (line.StartsWith($"### {id}: ", StringComparison.Ordinal))
                title = line[$"### {id}: ".Length..];
            else if (!haveX && line.StartsWith("| ", StringComparison.Ordinal))
            {
                xLabel = line[2..line.IndexOf(" |", StringComparison.Ordinal)];
                haveX = true;
            }
        }
        return (title, xLabel);
    }

    // A run of some figures replaces their sections in an existing summary.md (or appends them) and keeps the others,
    // so that `--figure 16` after a full run does not throw the full run's summary away.
    private static string MergeSummary(string path, string fresh)
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
        static int Number(string id) => int.TryParse(FigureNumber(id), out int n) ? n : int.MaxValue;
        return string.Concat(merged.OrderBy(s => Number(s.Id)).Select(s => s.Text)); // stable: fig12's two parts keep their order
    }

    private static string FindRepoRoot()
    {
        for (string? dir = Directory.GetCurrentDirectory(); dir is not null; dir = Path.GetDirectoryName(dir))
        {
            if (File.Exists(Path.Combine(dir, "EPVS.sln")))
                return dir;
        }
        return Directory.GetCurrentDirectory();
    }
}
