using System;
using System.CommandLine;
using System.CommandLine.Help;
using System.CommandLine.Parsing;
using System.Globalization;
using System.IO;

namespace Epvs.Samples;

/// <summary>
/// The command-line conventions every sample follows: <c>--help</c>/<c>-h</c>, named options checked against a range,
/// the positional form the README documents kept working, one-line errors that name the option, and exit codes
/// <see cref="Success"/>, <see cref="Failed"/> and <see cref="UsageError"/>.
/// </summary>
public static class SampleCli
{
    /// <summary>The run completed and every check it makes held (also: help was printed).</summary>
    public const int Success = 0;

    /// <summary>The run completed but a check failed, or the run itself failed.</summary>
    public const int Failed = 1;

    /// <summary>The command line was wrong: nothing was run.</summary>
    public const int UsageError = 2;

    /// <summary>
    /// A duration setting: a number of seconds (<c>3</c>, <c>0.5</c>) or a number with a unit (<c>500ms</c>, <c>3s</c>,
    /// <c>1m</c>), which must lie in [<paramref name="min"/>, <paramref name="max"/>].
    /// </summary>
    /// <param name="name">The option's name, with its dashes (<c>--duration</c>).</param>
    /// <param name="alias">A short name (<c>-d</c>), or null.</param>
    /// <param name="description">What the duration is for; the accepted form, range and default are appended.</param>
    /// <param name="defaultValue">The value when the setting is not given.</param>
    /// <param name="min">The smallest value accepted.</param>
    /// <param name="max">The largest value accepted.</param>
    /// <param name="positional">The name of its positional form (a bare number of seconds, as the README's usage lines give it), or null.</param>
    /// <returns>The setting, to add to a command.</returns>
    public static SampleSetting<TimeSpan> Duration(string name, string? alias, string description, TimeSpan defaultValue, TimeSpan min, TimeSpan max, string? positional = null)
    {
        return new SampleSetting<TimeSpan>(
            name,
            alias,
            $"{description}: seconds (3, 0.5) or with a unit (500ms, 3s, 1m), {Format(min)} to {Format(max)} [default: {Format(defaultValue)}]",
            "duration",
            defaultValue,
            positional,
            (result, label) => ParseDuration(result, label, min, max));
    }

    /// <summary>A whole-number setting that must lie in [<paramref name="min"/>, <paramref name="max"/>].</summary>
    /// <param name="name">The option's name, with its dashes (<c>--threads</c>).</param>
    /// <param name="alias">A short name (<c>-t</c>), or null.</param>
    /// <param name="description">What the number is; the range and default are appended.</param>
    /// <param name="defaultValue">The value when the setting is not given.</param>
    /// <param name="min">The smallest value accepted.</param>
    /// <param name="max">The largest value accepted.</param>
    /// <param name="positional">The name of its positional form, or null.</param>
    /// <returns>The setting, to add to a command.</returns>
    public static SampleSetting<int> Int(string name, string? alias, string description, int defaultValue, int min, int max, string? positional = null)
    {
        return new SampleSetting<int>(
            name,
            alias,
            $"{description}, {min} to {max} [default: {defaultValue}]",
            "n",
            defaultValue,
            positional,
            (result, label) => ParseInt(result, label, min, max));
    }

    /// <summary>
    /// Parses <paramref name="args"/> and runs <paramref name="run"/> when they are valid. Help goes to
    /// <paramref name="output"/> (exit 0); errors go to <paramref name="error"/> as one line each, with a pointer to
    /// <c>--help</c> and no stack trace (exit <see cref="UsageError"/>); an exception from the run is reported on
    /// <paramref name="error"/> (exit <see cref="Failed"/>).
    /// </summary>
    /// <param name="command">The command with its options and arguments.</param>
    /// <param name="args">The command line.</param>
    /// <param name="output">Where help and the run's report go.</param>
    /// <param name="error">Where errors go.</param>
    /// <param name="run">The program, given the parse result; returns the exit code.</param>
    /// <returns>The exit code.</returns>
    public static int Invoke(RootCommand command, string[] args, TextWriter output, TextWriter error, Func<ParseResult, int> run)
    {
        ArgumentNullException.ThrowIfNull(command);
        ArgumentNullException.ThrowIfNull(output);
        ArgumentNullException.ThrowIfNull(error);
        ArgumentNullException.ThrowIfNull(run);
        command.SetAction(run);
        ParseResult parse = command.Parse(args);
        var invocation = new InvocationConfiguration { Output = output, Error = error, EnableDefaultExceptionHandler = false };

        // Help wins over errors elsewhere on the line (`--threads x --help` prints help), as users expect.
        if (parse.Action is HelpAction)
        {
            return parse.Invoke(invocation) == 0 ? Success : UsageError;
        }

        if (ReportErrors(parse, error))
        {
            return UsageError;
        }

        try
        {
            return parse.Invoke(invocation);
        }
        catch (Exception exception) when (exception is not OutOfMemoryException)
        {
            // A failed run, not a usage error: say what failed; the details are for a bug report.
            error.WriteLine($"error: the run failed: {exception.GetType().Name}: {exception.Message}");
            error.WriteLine(exception.ToString());
            return Failed;
        }
    }

    /// <summary>
    /// Writes the parse errors of <paramref name="parse"/>, one line each, and a pointer to --help; returns whether there
    /// were any (then the program exits with <see cref="UsageError"/> instead of System.CommandLine's 1). Shared by the
    /// samples and the benchmark programs, so every program of the repository reports bad input the same way.
    /// </summary>
    /// <param name="parse">The parse result.</param>
    /// <param name="error">Where errors go.</param>
    /// <returns>Whether the command line had errors.</returns>
    public static bool ReportErrors(ParseResult parse, TextWriter error)
    {
        ArgumentNullException.ThrowIfNull(parse);
        ArgumentNullException.ThrowIfNull(error);
        if (parse.Errors.Count == 0)
        {
            return false;
        }

        foreach (ParseError parseError in parse.Errors)
        {
            error.WriteLine($"error: {parseError.Message}");
        }

        error.WriteLine($"Run '{parse.RootCommandResult.Command.Name} --help' for the options.");
        return true;
    }

    /// <summary>A duration the way the help text writes it: 500ms, 3s, 1.5s, 2m.</summary>
    /// <param name="value">The duration.</param>
    /// <returns>The text.</returns>
    public static string Format(TimeSpan value)
    {
        if (value < TimeSpan.FromSeconds(1))
        {
            return FormattableString.Invariant($"{value.TotalMilliseconds:0.###}ms");
        }

        return value < TimeSpan.FromMinutes(1) || value.TotalMinutes % 1 != 0
            ? FormattableString.Invariant($"{value.TotalSeconds:0.###}s")
            : FormattableString.Invariant($"{value.TotalMinutes:0}m");
    }

    /// <summary>Parses <c>3</c>, <c>0.5</c>, <c>500ms</c>, <c>3s</c>, <c>1.5m</c>; null for an empty text or a bad one.</summary>
    /// <param name="text">The text.</param>
    /// <param name="value">The duration.</param>
    /// <returns>Whether the text was a duration.</returns>
    public static bool TryParseDuration(string text, out TimeSpan value)
    {
        ArgumentNullException.ThrowIfNull(text);
        value = default;
        string s = text.Trim();
        double scale = 1;
        if (s.EndsWith("ms", StringComparison.OrdinalIgnoreCase))
        {
            (s, scale) = (s[..^2], 0.001);
        }
        else if (s.EndsWith('s') || s.EndsWith('S'))
        {
            s = s[..^1];
        }
        else if (s.EndsWith('m') || s.EndsWith('M'))
        {
            (s, scale) = (s[..^1], 60);
        }

        if (!double.TryParse(s, NumberStyles.AllowDecimalPoint | NumberStyles.AllowLeadingSign, CultureInfo.InvariantCulture, out double number)
            || double.IsNaN(number) || double.IsInfinity(number) || Math.Abs(number * scale) > TimeSpan.MaxValue.TotalSeconds / 2)
        {
            return false;
        }

        value = TimeSpan.FromSeconds(number * scale);
        return true;
    }

    private static TimeSpan? ParseDuration(ArgumentResult result, string name, TimeSpan min, TimeSpan max)
    {
        if (result.Tokens.Count == 0)
        {
            return null;
        }

        string text = result.Tokens[0].Value;
        if (!TryParseDuration(text, out TimeSpan value))
        {
            if (text.StartsWith('-'))
            {
                result.AddError($"'{text}' is not an option of this program.");
                return null;
            }

            result.AddError($"{name}: '{text}' is not a duration; give seconds (3, 0.5) or a number with a unit (500ms, 3s, 1m).");
            return null;
        }

        if (value < min || value > max)
        {
            result.AddError($"{name}: '{text}' is out of range; give {Format(min)} to {Format(max)}.");
            return null;
        }

        return value;
    }

    private static int? ParseInt(ArgumentResult result, string name, int min, int max)
    {
        if (result.Tokens.Count == 0)
        {
            return null;
        }

        string text = result.Tokens[0].Value;
        if (!int.TryParse(text, NumberStyles.AllowLeadingSign, CultureInfo.InvariantCulture, out int value))
        {
            if (text.StartsWith('-') && !double.TryParse(text, NumberStyles.Float, CultureInfo.InvariantCulture, out _))
            {
                result.AddError($"'{text}' is not an option of this program.");
                return null;
            }

            result.AddError($"{name}: '{text}' is not a whole number; give {min} to {max}.");
            return null;
        }

        if (value < min || value > max)
        {
            result.AddError($"{name}: {value} is out of range; give {min} to {max}.");
            return null;
        }

        return value;
    }
}
