using System;
using System.Collections.Generic;
using System.Globalization;
using System.IO;
using System.Linq;
using System.Net;
using System.Text;

namespace Epvs.Benchmarks;

/// <summary>
/// Turns the joined GitHub-Markdown report of a suite run into a horizontal bar chart (SVG) of the median per-operation
/// time, one group per category, so the Epvs/FASTER.core ratios can be seen at a glance. No plotting package is
/// served by the package mirror, so this writes the SVG itself.
/// </summary>
public static class ReportPlot
{
    /// <summary>Reads <paramref name="reportPath"/> and writes <paramref name="svgPath"/>.</summary>
    public static void Write(string reportPath, string svgPath)
    {
        var rows = new List<(string Group, string Method, double Ns)>();
        string[]? header = null;
        foreach (string raw in File.ReadLines(reportPath))
        {
            if (!raw.StartsWith('|'))
                continue;
            string[] cells = raw.Replace("**", "").Trim('|').Split('|').Select(c => c.Trim()).ToArray();
            if (header is null)
            {
                header = cells;
                continue;
            }
            if (cells.All(c => c.Length == 0 || c.All(ch => ch == '-' || ch == ':')))
                continue;
            string Cell(string name) => Array.IndexOf(header, name) is int i && i >= 0 && i < cells.Length ? cells[i] : "";
            string method = Cell("Method");
            if (method.Length == 0)
                continue;
            string category = Cell("Categories");
            string group = category.Length == 0 ? "Reader side, uncontended (" + Cell("Type") + ")" : category;
            string refreshers = Cell("Refreshers");
            if (refreshers.Length > 0 && refreshers != "?")
                group += $", {refreshers} other thread(s) refreshing";
            rows.Add((group, method, ParseNs(Cell("Median"))));
        }

        const int labelW = 300, barW = 480, rowH = 18, groupGap = 26, top = 50;
        double max = rows.Select(r => r.Ns).DefaultIfEmpty(1).Max();
        var groups = rows.GroupBy(r => r.Group).ToList();
        int height = top + groups.Count * groupGap + rows.Count * rowH + 40;
        var sb = new StringBuilder();
        sb.AppendLine($"<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{labelW + barW + 120}\" height=\"{height}\" font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\">");
        sb.AppendLine($"<rect width=\"100%\" height=\"100%\" fill=\"white\"/>");
        sb.AppendLine($"<text x=\"10\" y=\"22\" font-size=\"15\" font-weight=\"bold\">Per-operation cost, median ns (shorter is better): Epvs (blue) vs FASTER.core 2.6.5 (orange)</text>");
        double y = top;
        foreach (var g in groups)
        {
            y += groupGap;
            sb.AppendLine($"<text x=\"10\" y=\"{F(y - 8)}\" font-weight=\"bold\">{Esc(g.Key)}</text>");
            foreach ((string _, string method, double ns) in g)
            {
                string color = method.StartsWith("Faster", StringComparison.Ordinal) ? "#ff7f0e" : method.StartsWith("Epvs", StringComparison.Ordinal) ? "#1f77b4" : "#8c8c8c";
                double w = max > 0 ? barW * ns / max : 0;
                sb.AppendLine($"<text x=\"{labelW - 6}\" y=\"{F(y + 12)}\" text-anchor=\"end\">{Esc(method)}</text>");
                sb.AppendLine($"<rect x=\"{labelW}\" y=\"{F(y + 2)}\" width=\"{F(Math.Max(w, 1))}\" height=\"{rowH - 4}\" fill=\"{color}\"/>");
                sb.AppendLine($"<text x=\"{F(labelW + Math.Max(w, 1) + 4)}\" y=\"{F(y + 12)}\">{ns.ToString("0.##", CultureInfo.InvariantCulture)} ns</text>");
                y += rowH;
            }
        }
        sb.AppendLine("</svg>");
        File.WriteAllText(svgPath, sb.ToString());
    }

    private static double ParseNs(string cell)
    {
        string[] parts = cell.Replace(",", "").Split(' ', StringSplitOptions.RemoveEmptyEntries);
        if (parts.Length == 0 || !double.TryParse(parts[0], NumberStyles.Float, CultureInfo.InvariantCulture, out double v))
            return double.NaN;
        return parts.Length > 1 ? parts[1] switch { "us" or "μs" => v * 1e3, "ms" => v * 1e6, "s" => v * 1e9, _ => v } : v;
    }

    private static string F(double v) => v.ToString("0.#", CultureInfo.InvariantCulture);

    private static string Esc(string s) => WebUtility.HtmlEncode(s);
}
